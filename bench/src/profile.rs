//! `--profile-dir DIR`: where the processes of a spawned run spend their time under load, to
//! find what caps a run on a machine with many cores (docs/scaling.md, "What one execution
//! costs").
//!
//! Once the warm-up is over, for [`Window::seconds`] of the measured run:
//! - every nats-server node: Go's CPU profile (`NAME-cpu.pb.gz`) from its profiling port
//!   (`prof_port`), and its block profile over the same window (`NAME-block.pb.gz`: where
//!   goroutines waited on a mutex or a channel, sampled per [`NATS_BLOCK_RATE_NS`] blocked;
//!   idle goroutines wait in `runtime.selectgo`, contention shows as `sync.(*Mutex).Lock` and
//!   `sync.(*RWMutex)`). Read them with `go tool pprof -top FILE` (the functions are named in
//!   the file; no binary needed).
//! - every gateway and worker process: `perf record` at [`PERF_HZ`] samples a second, when
//!   `perf` runs here (`MRT_PERF`, else `perf` on the `PATH`), reported flat by symbol into
//!   `NAME.perf.txt` (release binaries keep their symbols unless stripped).
//!
//! Profiling costs the processes some CPU (the block profile most), so a profiled run's
//! figures are not the run's figures: run it beside an unprofiled one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// nats-server's `prof_block_rate`: one block event sampled per this many nanoseconds blocked.
pub const NATS_BLOCK_RATE_NS: u64 = 10_000;

/// `perf record -F`: samples a second per thread (odd, so it does not beat with timers).
pub const PERF_HZ: u32 = 499;

/// When to profile, from the start of the load.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// After the warm-up, when the measurement starts.
    pub start_after: Duration,
    pub seconds: u64,
}

impl Window {
    /// The profile window of a run that warms up for `warmup_s` and measures for
    /// `duration_s` (`None`: until an execution count is reached): after the warm-up, up to
    /// 10 s and at least 1 s, ending a second before the measurement does.
    pub fn of_run(warmup_s: f64, duration_s: Option<f64>) -> Self {
        let measured = duration_s.unwrap_or(6.0);
        // Lossless enough: clamped to 1..=10 seconds.
        let seconds = (measured - 1.0).clamp(1.0, 10.0).floor() as u64;
        Self {
            start_after: Duration::from_secs_f64(warmup_s.max(0.0)),
            seconds,
        }
    }
}

/// What to profile.
#[derive(Debug, Clone)]
pub struct Targets {
    /// `(name, prof_port)` of every nats-server node.
    pub nats: Vec<(String, u16)>,
    /// `(name, pid)` of every gateway and worker process.
    pub processes: Vec<(String, u32)>,
}

/// Captures the profiles of `targets` into `dir` during `window` (see the module docs) and
/// returns one line per profile: the file written, or why there is none.
pub async fn capture(
    dir: PathBuf,
    window: Window,
    targets: Targets,
    http: reqwest::Client,
) -> Vec<String> {
    tokio::time::sleep(window.start_after).await;
    let mut tasks = Vec::new();
    for (name, port) in targets.nats {
        let (dir, http) = (dir.clone(), http.clone());
        tasks.push(tokio::spawn(async move {
            go_profiles(&dir, &name, port, window.seconds, &http).await
        }));
    }
    let perf = perf_binary();
    for (name, pid) in targets.processes {
        let (dir, perf) = (dir.clone(), perf.clone());
        tasks.push(tokio::spawn(async move {
            let lines = tokio::task::spawn_blocking(move || match perf {
                Ok(perf) => vec![perf_profile(&perf, &dir, &name, pid, window.seconds)],
                Err(why) => vec![format!("{name}: not profiled ({why})")],
            });
            lines
                .await
                .unwrap_or_else(|e| vec![format!("profiler task failed: {e}")])
        }));
    }
    let mut lines = Vec::new();
    for task in tasks {
        match task.await {
            Ok(mut more) => lines.append(&mut more),
            Err(e) => lines.push(format!("profiler task failed: {e}")),
        }
    }
    lines
}

/// The CPU and block profiles of the node at `port`, both over the same `seconds` (the block
/// profile as the difference over the window, not since the server started).
async fn go_profiles(
    dir: &Path,
    name: &str,
    port: u16,
    seconds: u64,
    http: &reqwest::Client,
) -> Vec<String> {
    let base = format!("http://127.0.0.1:{port}/debug/pprof");
    let fetch = |kind: &'static str, path: &'static str| {
        let url = format!("{base}/{path}?seconds={seconds}");
        let file = dir.join(format!("{name}-{kind}.pb.gz"));
        async move {
            let fetched = async {
                let resp = http
                    .get(url)
                    .timeout(Duration::from_secs(seconds + 30))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                if !resp.status().is_success() {
                    return Err(format!("HTTP {}", resp.status()));
                }
                let body = resp.bytes().await.map_err(|e| e.to_string())?;
                std::fs::write(&file, &body).map_err(|e| e.to_string())?;
                Ok(body.len())
            };
            match fetched.await {
                Ok(bytes) => format!("{name}: {} ({bytes} bytes)", file.display()),
                Err(e) => format!("{name}: no {kind} profile ({e})"),
            }
        }
    };
    let (cpu, block) = tokio::join!(fetch("cpu", "profile"), fetch("block", "block"));
    vec![cpu, block]
}

/// The `perf` to run, if one runs here.
fn perf_binary() -> Result<PathBuf, String> {
    let perf = std::env::var_os("MRT_PERF").map_or_else(|| PathBuf::from("perf"), PathBuf::from);
    match Command::new(&perf)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(status) if status.success() => Ok(perf),
        Ok(status) => Err(format!("{} --version: {status}", perf.display())),
        Err(e) => Err(format!("no perf here ({e}); set MRT_PERF")),
    }
}

/// `perf record` of process `pid` for `seconds`, reported flat by symbol into `NAME.perf.txt`
/// (the raw `NAME.perf.data` is removed once reported).
fn perf_profile(perf: &Path, dir: &Path, name: &str, pid: u32, seconds: u64) -> String {
    let data = dir.join(format!("{name}.perf.data"));
    let text = dir.join(format!("{name}.perf.txt"));
    let recorded = Command::new(perf)
        .args([
            "record",
            "-q",
            "-F",
            &PERF_HZ.to_string(),
            "-p",
            &pid.to_string(),
            "-o",
        ])
        .arg(&data)
        .args(["--", "sleep", &seconds.to_string()])
        .stdout(Stdio::null())
        .output();
    match recorded {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return format!(
                "{name}: perf record failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Err(e) => return format!("{name}: cannot run perf ({e})"),
    }
    let report = Command::new(perf)
        .args([
            "report",
            "--stdio",
            "--no-children",
            "--percent-limit",
            "0.3",
        ])
        .args(["--sort", "dso,sym", "-i"])
        .arg(&data)
        .output();
    match report {
        Ok(out) if out.status.success() => match std::fs::write(&text, &out.stdout) {
            Ok(()) => {
                let _ = std::fs::remove_file(&data);
                format!("{name}: {}", text.display())
            }
            Err(e) => format!("{name}: cannot write {}: {e}", text.display()),
        },
        Ok(out) => format!(
            "{name}: perf report failed ({}): {}; the data stays in {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            data.display()
        ),
        Err(e) => format!("{name}: cannot run perf report ({e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_starts_after_the_warm_up_and_ends_before_the_run() {
        let w = Window::of_run(3.0, Some(10.0));
        assert_eq!(w.start_after, Duration::from_secs(3));
        assert_eq!(w.seconds, 9);
        assert_eq!(Window::of_run(0.0, Some(60.0)).seconds, 10);
        assert_eq!(Window::of_run(1.0, Some(1.5)).seconds, 1);
        assert_eq!(Window::of_run(2.0, None).seconds, 5);
    }
}
