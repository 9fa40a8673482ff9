//! The few OS facts the bench needs: the open-file limit, a process's RSS and CPU time
//! from /proc, and signals to child processes.
//!
//! This is the only module with `unsafe`: libc's `getrlimit`/`setrlimit`/`sysconf`/`kill`
//! have no safe std equivalent, and each call below only passes plain values or a struct
//! this function owns.
#![allow(unsafe_code)]

use std::io;

/// Raises RLIMIT_NOFILE to at least `want` (the hard limit too when privileged, as root is
/// here) and returns the soft limit now in force. Unprivileged, it settles for the hard limit.
pub fn raise_nofile(want: u64) -> io::Result<u64> {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `current`, which lives for the whole call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut current) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if current.rlim_cur >= want {
        return Ok(current.rlim_cur);
    }
    let wanted = libc::rlimit {
        rlim_cur: want,
        rlim_max: current.rlim_max.max(want),
    };
    // SAFETY: setrlimit only reads `wanted`.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } == 0 {
        return Ok(want);
    }
    let capped = libc::rlimit {
        rlim_cur: current.rlim_max,
        rlim_max: current.rlim_max,
    };
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &capped) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(capped.rlim_cur)
}

/// Clock ticks per second, the unit of utime/stime in /proc/PID/stat.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf takes a constant and touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

/// Resident set size of `pid` in bytes (VmRSS).
pub fn rss_bytes(pid: u32) -> io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_vm_rss(&status).ok_or_else(|| io::Error::other("no VmRSS line in /proc/PID/status"))
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// User plus system CPU time of `pid` in seconds.
pub fn cpu_seconds(pid: u32) -> io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let ticks = parse_cpu_ticks(&stat).ok_or_else(|| io::Error::other("bad /proc/PID/stat"))?;
    Ok(ticks as f64 / clock_ticks_per_second() as f64)
}

/// utime + stime (fields 14 and 15); counted after the `)` that ends the command name,
/// because the name itself may contain spaces or parentheses.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Sends `signal` (e.g. `libc::SIGTERM`) to `pid`.
pub fn send_signal(pid: u32, signal: i32) -> io::Result<()> {
    // SAFETY: kill takes plain integers.
    if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rss_line() {
        let status = "Name:\tx\nVmPeak:\t  9 kB\nVmRSS:\t    1234 kB\nThreads:\t2\n";
        assert_eq!(parse_vm_rss(status), Some(1234 * 1024));
    }

    #[test]
    fn reads_cpu_ticks_past_odd_names() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 1 0 9 1 1";
        assert_eq!(parse_cpu_ticks(stat), Some(22));
    }

    #[test]
    fn own_process_is_readable() {
        let pid = std::process::id();
        assert!(rss_bytes(pid).unwrap() > 0);
        assert!(cpu_seconds(pid).unwrap() >= 0.0);
    }
}
