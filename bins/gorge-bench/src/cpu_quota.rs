//! A CPU budget for one child process, as if it ran on a machine of its own: a cgroup whose
//! CFS quota is `cores` CPUs, the child moved into it.
//!
//! Replicas of a service run on machines (or pods with CPU limits) of their own; on this
//! bench's single machine they would otherwise share its cores with the database and the
//! receiver, so adding a replica could only redistribute the same CPU. With a budget per
//! process, "does a second replica add throughput?" becomes a question about the shared
//! database and the claim protocol, which is what the measurement is for.
//!
//! Needs a writable cgroup file system: v1's `cpu` controller (`cpu.cfs_quota_us`) or v2
//! with the `cpu` controller enabled for the root's children (`cpu.max`). Otherwise
//! [`CpuQuota::new`] says why, and the bench stops before measuring anything.

use std::path::{Path, PathBuf};

/// The CFS period the quota is a share of.
const PERIOD_US: u64 = 100_000;

/// One cgroup holding one process, removed when dropped (after its process exited).
pub struct CpuQuota {
    dir: PathBuf,
}

impl CpuQuota {
    /// Creates the cgroup `name` with a budget of `cores` CPUs.
    pub fn new(name: &str, cores: f64) -> Result<CpuQuota, String> {
        if !(cores > 0.0 && cores <= 64.0) {
            return Err(format!(
                "CPU budget {cores}: want a number of CPUs in (0, 64]"
            ));
        }
        let quota = ((cores * PERIOD_US as f64).round() as u64).max(1_000);
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        // Where the cgroup goes, and what its files get, in order.
        let (dir, settings) = if v1.join("cpu.cfs_quota_us").exists() {
            (
                v1.join(name),
                vec![
                    ("cpu.cfs_period_us", PERIOD_US.to_string()),
                    ("cpu.cfs_quota_us", quota.to_string()),
                ],
            )
        } else if std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
            .is_ok_and(|enabled| enabled.split_whitespace().any(|c| c == "cpu"))
        {
            (
                Path::new("/sys/fs/cgroup").join(name),
                vec![("cpu.max", format!("{quota} {PERIOD_US}"))],
            )
        } else {
            return Err(
                "CPU budgets need cgroup v1's cpu controller at /sys/fs/cgroup/cpu, \
                        or cgroup v2 with +cpu in /sys/fs/cgroup/cgroup.subtree_control"
                    .into(),
            );
        };
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let quota = CpuQuota { dir };
        for (file, value) in settings {
            quota.write(file, &value)?;
        }
        Ok(quota)
    }

    /// Moves process `pid` (every thread of it) into the cgroup.
    pub fn add(&self, pid: u32) -> Result<(), String> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// CPU seconds the cgroup's processes were throttled for (v1 `throttled_time`, v2
    /// `throttled_usec`): how much the budget held them back.
    pub fn throttled_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
        stat.lines().find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            let value: f64 = value.trim().parse().ok()?;
            match key {
                "throttled_time" => Some(value / 1e9),
                "throttled_usec" => Some(value / 1e6),
                _ => None,
            }
        })
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let path = self.dir.join(file);
        std::fs::write(&path, value).map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        // Fails while a process is still inside: the rig stops its processes first, but a
        // run cut short only sends SIGKILL (`kill_on_drop`), and the cgroup empties once the
        // kernel has reaped the process. So try for a moment.
        for _ in 0..200 {
            match std::fs::remove_dir(&self.dir) {
                Err(e) if e.raw_os_error() == Some(16) => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                _ => return,
            }
        }
        eprintln!(
            "gorge-bench: {} left behind (still busy)",
            self.dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::CpuQuota;

    #[test]
    fn a_budget_outside_the_range_is_refused_before_touching_cgroups() {
        for cores in [0.0, -1.0, f64::NAN, 65.0] {
            let err = CpuQuota::new("gorge-bench-never-made", cores)
                .err()
                .expect("refused");
            assert!(err.contains("want a number of CPUs"), "{err}");
        }
    }
}
