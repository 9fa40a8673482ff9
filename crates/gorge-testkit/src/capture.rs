//! A slog logger that keeps the event names (record messages) it is given, for tests that
//! count or order log events of code running in the test process.

use std::sync::{Arc, Mutex};

/// Event names logged through [`CapturedLog::logger`], in order.
#[derive(Clone, Default)]
pub struct CapturedLog(Arc<Mutex<Vec<String>>>);

impl CapturedLog {
    pub fn logger(&self) -> slog::Logger {
        slog::Logger::root(CaptureDrain(self.0.clone()), slog::o!())
    }

    pub fn events(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// How many times `event` was logged.
    pub fn count(&self, event: &str) -> usize {
        self.events().iter().filter(|e| *e == event).count()
    }

    /// The events whose name starts with `prefix`, in order.
    pub fn starting_with(&self, prefix: &str) -> Vec<String> {
        self.events()
            .into_iter()
            .filter(|event| event.starts_with(prefix))
            .collect()
    }
}

struct CaptureDrain(Arc<Mutex<Vec<String>>>);

impl slog::Drain for CaptureDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        self.0.lock().unwrap().push(record.msg().to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_event_names_in_order() {
        let log = CapturedLog::default();
        let logger = log.logger();
        slog::info!(logger, "A_STARTED"; "n" => 1);
        slog::warn!(logger, "B_FAILED");
        slog::info!(logger, "A_STARTED");
        assert_eq!(log.events(), ["A_STARTED", "B_FAILED", "A_STARTED"]);
        assert_eq!(log.count("A_STARTED"), 2);
        assert_eq!(log.starting_with("B_"), ["B_FAILED"]);
    }
}
