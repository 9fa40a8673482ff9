//! One wrapper for the service processes integration tests start: stdout read as JSON log
//! lines on a helper thread, waits for a log event, signals through rustix (the workspace
//! forbids `unsafe`), and a kill when the test ends however it ends.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use rustix::process::Signal;
use rustix::process::{kill_process, Pid};
use serde_json::Value;

use crate::PATIENCE;

/// Every line the process wrote to stdout, and whether stdout has ended.
#[derive(Default)]
struct Lines {
    lines: Vec<String>,
    ended: bool,
}

#[derive(Default)]
struct Output {
    state: Mutex<Lines>,
    changed: Condvar,
}

/// Most stderr bytes kept by [`Process::spawn_keeping_stderr`].
const STDERR_LIMIT: usize = 64 * 1024;

/// A running child process; killed (SIGKILL) and reaped when dropped.
pub struct Process {
    child: Child,
    output: Arc<Output>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl Process {
    /// Spawns `command` with stdin closed, stderr discarded and stdout collected line by
    /// line (the services log JSON lines there with `GORGE_LOG_FORMAT=json`).
    pub fn spawn(command: Command) -> Process {
        Process::start(command, None, false)
    }

    /// Like [`Process::spawn`], and keeps stderr (its first 64 KiB) for [`Process::stderr`].
    pub fn spawn_keeping_stderr(command: Command) -> Process {
        Process::start(command, None, true)
    }

    /// Like [`Process::spawn`], but stops reading stdout and closes its pipe once `event`
    /// has been logged (as `head` or a restarting journald would: the process's next write
    /// to stdout fails), and keeps stderr (its first 64 KiB) for [`Process::stderr`].
    pub fn spawn_closing_stdout_after(command: Command, event: &str) -> Process {
        Process::start(command, Some(event.to_owned()), true)
    }

    fn start(mut command: Command, close_after: Option<String>, keep_stderr: bool) -> Process {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if keep_stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", command.get_program()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let output = Arc::new(Output::default());
        let collected = Arc::clone(&output);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let last = close_after.as_deref().is_some_and(|event| {
                    !events_named(std::slice::from_ref(&line), event).is_empty()
                });
                collected.state.lock().unwrap().lines.push(line);
                collected.changed.notify_all();
                if last {
                    break; // drops the reader: the pipe's read end closes
                }
            }
            collected.state.lock().unwrap().ended = true;
            collected.changed.notify_all();
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        if let Some(mut pipe) = child.stderr.take() {
            let kept = Arc::clone(&stderr);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                    let mut kept = kept.lock().unwrap();
                    let room = STDERR_LIMIT.saturating_sub(kept.len());
                    kept.extend_from_slice(&chunk[..n.min(room)]);
                }
            });
        }
        Process {
            child,
            output,
            stderr,
        }
    }

    /// What the process wrote to stderr so far (only kept by
    /// [`Process::spawn_keeping_stderr`] and [`Process::spawn_closing_stdout_after`]; empty
    /// otherwise).
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Every stdout line so far.
    pub fn lines(&self) -> Vec<String> {
        self.output.state.lock().unwrap().lines.clone()
    }

    /// The JSON log lines whose `event` is `event`, in order.
    pub fn log_events(&self, event: &str) -> Vec<Value> {
        events_named(&self.output.state.lock().unwrap().lines, event)
    }

    /// Blocks until `event` has been logged and returns its first occurrence; `None` when
    /// stdout ends (the process exited) or `timeout` passes first.
    pub fn wait_for_event(&self, event: &str, timeout: Duration) -> Option<Value> {
        self.wait_for_events(event, 1, timeout)
            .and_then(|events| events.into_iter().next())
    }

    /// Blocks until `event` has been logged `count` times; returns every occurrence so far,
    /// or `None` when stdout ends or `timeout` passes first.
    pub fn wait_for_events(
        &self,
        event: &str,
        count: usize,
        timeout: Duration,
    ) -> Option<Vec<Value>> {
        wait_for_events(&self.output, event, count, timeout)
    }

    /// [`Process::wait_for_event`] for async tests (on a blocking thread, so the runtime
    /// keeps serving the test's other tasks); panics after [`PATIENCE`].
    pub async fn logged(&self, event: &str) -> Value {
        let output = Arc::clone(&self.output);
        let name = event.to_owned();
        let found =
            tokio::task::spawn_blocking(move || wait_for_events(&output, &name, 1, PATIENCE))
                .await
                .unwrap();
        let mut events = found.unwrap_or_else(|| panic!("{event} was never logged"));
        events.swap_remove(0)
    }

    /// Sends `signal` (e.g. [`Signal::TERM`]); panics if the process is gone.
    pub fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(self.child.id() as i32).expect("a child pid is positive");
        kill_process(pid, signal).unwrap_or_else(|e| panic!("signal {signal:?}: {e}"));
    }

    pub fn sigterm(&self) {
        self.signal(Signal::TERM);
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The exit status if the process has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits until the process exits; panics after [`PATIENCE`].
    pub async fn exited(&mut self) -> ExitStatus {
        let mut status = None;
        crate::eventually(PATIENCE, "the process exits", || {
            status = self.try_wait();
            std::future::ready(status.is_some())
        })
        .await;
        status.expect("exited")
    }
}

fn wait_for_events(
    output: &Output,
    event: &str,
    count: usize,
    timeout: Duration,
) -> Option<Vec<Value>> {
    let deadline = Instant::now() + timeout;
    let mut state = output.state.lock().unwrap();
    loop {
        let events = events_named(&state.lines, event);
        if events.len() >= count {
            return Some(events);
        }
        let left = deadline.checked_duration_since(Instant::now())?;
        if state.ended {
            return None;
        }
        state = output.changed.wait_timeout(state, left).unwrap().0;
    }
}

fn events_named(lines: &[String], event: &str) -> Vec<Value> {
    lines
        .iter()
        .filter(|line| line.contains(event))
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|value| value["event"] == event)
        .collect()
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `program` with exactly `env` (nothing inherited) to the end; exit code, stdout and
/// stderr.
pub fn run_to_end(
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let output = Command::new(program)
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(script: &str) -> Process {
        let mut command = Command::new("/bin/sh");
        command.args(["-c", script]);
        Process::spawn(command)
    }

    #[test]
    fn waits_for_an_event_by_name_not_by_substring() {
        let process = shell(
            r#"echo '{"event":"READY_SOON"}'; sleep 0.2; echo '{"event":"READY","port":7}'; sleep 5"#,
        );
        let ready = process.wait_for_event("READY", PATIENCE).unwrap();
        assert_eq!(ready["port"], 7);
        assert_eq!(process.log_events("READY_SOON").len(), 1);
    }

    #[test]
    fn an_exit_ends_the_wait_at_once() {
        let process = shell(r#"echo '{"event":"OTHER"}'"#);
        let started = Instant::now();
        assert!(process.wait_for_event("READY", PATIENCE).is_none());
        assert!(started.elapsed() < PATIENCE / 2);
    }

    #[tokio::test]
    async fn sigterm_reaches_the_child() {
        let mut process = shell("trap 'echo \"{\\\"event\\\":\\\"TERM\\\"}\"; exit 3' TERM; echo '{\"event\":\"UP\"}'; while :; do sleep 0.05; done");
        process.wait_for_event("UP", PATIENCE).unwrap();
        process.sigterm();
        assert_eq!(process.exited().await.code(), Some(3));
        assert_eq!(process.log_events("TERM").len(), 1);
    }

    #[test]
    fn runs_with_exactly_the_given_environment() {
        let (code, stdout, _) = run_to_end(
            "/bin/sh",
            &["-c", "echo \"$A:$HOME\"; exit 4"],
            &[("A", "x")],
        );
        assert_eq!((code, stdout.as_str()), (Some(4), "x:\n"));
    }
}
