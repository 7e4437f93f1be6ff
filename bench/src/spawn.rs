//! `--spawn`: start the gateway binary with a generated deployment file in a temporary directory,
//! on port 0, and read its resource use from `/proc`.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Memory and CPU of a process, from `/proc/PID/status` and `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct ProcStats {
    /// Resident set size now (`VmRSS`), KiB.
    pub rss_kb: Option<u64>,
    /// Peak resident set size (`VmHWM`), KiB.
    pub hwm_kb: Option<u64>,
    pub threads: Option<u64>,
    /// User plus system CPU time consumed so far, seconds.
    pub cpu_s: Option<f64>,
}

/// Clock ticks per second for `/proc/PID/stat` (`getconf CLK_TCK`, 100 on every mainstream Linux).
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// Reads `/proc/{pid}/status` and `/proc/{pid}/stat` (`pid` may be `self`).
pub fn proc_stats(pid: &str, ticks: f64) -> ProcStats {
    let mut stats = ProcStats::default();
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        for line in status.lines() {
            let value = |l: &str| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            };
            if line.starts_with("VmRSS:") {
                stats.rss_kb = value(line);
            } else if line.starts_with("VmHWM:") {
                stats.hwm_kb = value(line);
            } else if line.starts_with("Threads:") {
                stats.threads = value(line);
            }
        }
    }
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
            // `rest` starts at field 3 (state), so field n is at index n - 3.
            if let (Some(u), Some(s)) = (tick(14 - 3), tick(15 - 3)) {
                stats.cpu_s = Some((u + s) as f64 / ticks);
            }
        }
    }
    stats
}

/// Busy CPU seconds of the whole machine since boot (`/proc/stat`: all time but idle and iowait),
/// so a window can show how much of the cores anything at all used.
pub fn system_busy_s(ticks: f64) -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some(total.saturating_sub(idle) as f64 / ticks)
}

/// CPU one process used during the measured run (`/proc/PID/stat` utime + stime).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessCpu {
    /// `gateway`, `worker-1`, `nats-n0`, `redis`, `bench`.
    pub name: String,
    pub pid: u32,
    /// CPU seconds over the measured run.
    pub cpu_s: Option<f64>,
    /// `cpu_s` / measured seconds: cores used on average.
    pub cores: Option<f64>,
    /// `VmRSS` at the end of the measured run, KiB.
    pub rss_end_kb: Option<u64>,
}

/// `(name, pid, CPU seconds so far)` of each process, now.
pub fn cpu_snapshot(processes: &[(String, u32)], ticks: f64) -> Vec<(String, u32, ProcStats)> {
    processes
        .iter()
        .map(|(name, pid)| {
            let proc_id = if *pid == std::process::id() {
                "self".to_string()
            } else {
                pid.to_string()
            };
            (name.clone(), *pid, proc_stats(&proc_id, ticks))
        })
        .collect()
}

/// Per-process CPU between two snapshots of the same processes `elapsed_s` apart.
pub fn cpu_between(
    start: &[(String, u32, ProcStats)],
    end: &[(String, u32, ProcStats)],
    elapsed_s: f64,
) -> Vec<ProcessCpu> {
    start
        .iter()
        .zip(end)
        .map(|((name, pid, a), (_, _, b))| {
            let cpu_s = a.cpu_s.zip(b.cpu_s).map(|(a, b)| b - a);
            ProcessCpu {
                name: name.clone(),
                pid: *pid,
                cpu_s,
                cores: cpu_s
                    .filter(|_| elapsed_s > 0.0)
                    .map(|c| (c / elapsed_s * 1000.0).round() / 1000.0),
                rss_end_kb: b.rss_kb,
            }
        })
        .collect()
}

/// What to put in the generated deployment file.
#[derive(Debug, Clone)]
pub struct MockDeployment {
    pub delay_ms: u64,
    /// `None`: the mock's default chunks ("hello", " from", " mock").
    pub chunks: Option<usize>,
    pub max_concurrency: u32,
    pub max_queue_depth: u32,
    pub max_active_executions: usize,
    /// `limits.max_sse_streams` and `limits.max_connections`; the gateway's defaults if `None`.
    pub streams: Option<StreamLimits>,
}

/// The gateway's connection and stream limits, sized for the run's concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    pub max_sse_streams: usize,
    pub max_connections: usize,
}

/// The gateway's default `limits.max_sse_streams`.
const DEFAULT_MAX_SSE_STREAMS: usize = 10_000;
/// Open files the gateway keeps out of its default `max_connections` (open-file limit minus
/// this).
const GATEWAY_RESERVED_FILES: u64 = 64;

impl StreamLimits {
    /// Room for `concurrency` streams with their submits (each client holds one connection at a
    /// time, plus the pool's idle ones), never below the gateway's default stream limit.
    pub fn for_concurrency(concurrency: usize) -> Self {
        Self {
            max_sse_streams: (2 * concurrency).max(DEFAULT_MAX_SSE_STREAMS),
            max_connections: (2 * concurrency + 256).max(1024),
        }
    }

    /// [`StreamLimits::for_concurrency`] when the gateway's defaults would not hold
    /// `concurrency` streams: more than its default stream limit, or more connections than its
    /// default derived from the open-file limit (`nofile`, which the gateway inherits). `None`
    /// otherwise, so the generated file stays valid for builds that predate these settings.
    pub fn needed(concurrency: usize, nofile: Option<u64>) -> Option<Self> {
        let wanted = Self::for_concurrency(concurrency);
        let streams_short = 2 * concurrency > DEFAULT_MAX_SSE_STREAMS;
        let connections_short = nofile.is_some_and(|n| {
            n.saturating_sub(GATEWAY_RESERVED_FILES) < wanted.max_connections as u64
        });
        (streams_short || connections_short).then_some(wanted)
    }
}

impl MockDeployment {
    pub fn to_json(&self) -> serde_json::Value {
        let mut provider = serde_json::json!({
            "type": "mock",
            "id": "provider-mock",
            "model": "model-alpha",
            "abilities": ["text-generation"],
            "max_concurrency": self.max_concurrency,
            "max_queue_depth": self.max_queue_depth,
        });
        if self.delay_ms > 0 {
            provider["delay_ms"] = self.delay_ms.into();
        }
        if let Some(n) = self.chunks {
            let chunks: Vec<String> = (0..n).map(|i| format!("tok{i} ")).collect();
            provider["chunks"] = chunks.into();
        }
        let mut deployment = serde_json::json!({
            "providers": [provider],
            "max_active_executions": self.max_active_executions,
        });
        if let Some(limits) = self.streams {
            deployment["limits"] = serde_json::json!({
                "max_sse_streams": limits.max_sse_streams,
                "max_connections": limits.max_connections,
            });
        }
        deployment
    }
}

/// A gateway process started by the harness; killed on drop if not stopped.
#[derive(Debug)]
pub struct SpawnedGateway {
    child: Option<Child>,
    pub pid: u32,
    pub url: String,
    pub config: PathBuf,
    dir: PathBuf,
}

impl SpawnedGateway {
    /// Writes `config` (unless `config_file` is given) into a fresh temporary directory and
    /// starts `bin --port 0 --config FILE EXTRA...`, waiting for its `listening on` line.
    pub fn start(
        bin: &Path,
        config: &serde_json::Value,
        config_file: Option<&Path>,
        extra: &[String],
        log: Option<&Path>,
    ) -> Result<Self, String> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("mrt-bench-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let config_path = match config_file {
            Some(path) => path.to_path_buf(),
            None => {
                let path = dir.join("deployment.json");
                let text = serde_json::to_vec_pretty(config).map_err(|e| e.to_string())?;
                std::fs::write(&path, text)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                path
            }
        };
        let stderr = match log {
            Some(path) => Stdio::from(
                std::fs::File::create(path)
                    .map_err(|e| format!("cannot create {}: {e}", path.display()))?,
            ),
            None => Stdio::null(),
        };
        let mut child = Command::new(bin)
            .arg("--port")
            .arg("0")
            .arg("--config")
            .arg(&config_path)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let pid = child.id();
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            return Err("gateway stdout is not captured".into());
        };
        // Read the first line on a thread so a gateway that hangs cannot hang the harness; the
        // thread then keeps draining stdout so the gateway never blocks on a full pipe.
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            let mut sink = [0u8; 4096];
            while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
        });
        let mut gateway = Self {
            child: Some(child),
            pid,
            url: String::new(),
            config: config_path,
            dir,
        };
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "the gateway printed no address within 60 s".to_string())?;
        let Some(url) = line.trim().strip_prefix("listening on ") else {
            return Err(format!(
                "unexpected first line from the gateway: {:?} (exited: {})",
                line.trim(),
                gateway.exited()
            ));
        };
        gateway.url = url.to_string();
        Ok(gateway)
    }

    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// SIGTERM, then wait up to `grace` for the exit (SIGKILL after it). Returns the exit code.
    pub fn stop(mut self, grace: Duration) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status();
        let until = Instant::now() + grace;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status.code(),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    return child.wait().ok().and_then(|s| s.code());
                }
            }
        }
    }
}

impl Drop for SpawnedGateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_deployment_uses_contract_fields() {
        let d = MockDeployment {
            delay_ms: 0,
            chunks: None,
            max_concurrency: 256,
            max_queue_depth: 4096,
            max_active_executions: 4096,
            streams: None,
        };
        let v = d.to_json();
        assert_eq!(v["max_active_executions"], 4096);
        let p = &v["providers"][0];
        assert_eq!(p["type"], "mock");
        assert_eq!(p["abilities"][0], "text-generation");
        assert_eq!(p["max_concurrency"], 256);
        assert_eq!(p["max_queue_depth"], 4096);
        assert!(p.get("delay_ms").is_none() && p.get("chunks").is_none());
        assert!(v.get("limits").is_none());
        let v = MockDeployment {
            delay_ms: 5,
            chunks: Some(2),
            streams: Some(StreamLimits::for_concurrency(1024)),
            ..d
        }
        .to_json();
        assert_eq!(v["providers"][0]["delay_ms"], 5);
        assert_eq!(v["providers"][0]["chunks"][1], "tok1 ");
        assert_eq!(v["limits"]["max_sse_streams"], 10_000);
        assert_eq!(v["limits"]["max_connections"], 2 * 1024 + 256);
        assert_eq!(StreamLimits::for_concurrency(8_000).max_sse_streams, 16_000);
    }

    #[test]
    fn cpu_between_snapshots_in_cores() {
        let at = |cpu: f64| ProcStats {
            cpu_s: Some(cpu),
            rss_kb: Some(10),
            ..ProcStats::default()
        };
        let start = vec![
            ("gateway".to_string(), 7, at(1.0)),
            ("nats-n0".into(), 8, at(2.0)),
        ];
        let end = vec![
            ("gateway".to_string(), 7, at(4.0)),
            ("nats-n0".into(), 8, ProcStats::default()),
        ];
        let cpu = cpu_between(&start, &end, 2.0);
        assert_eq!(cpu[0].cpu_s, Some(3.0));
        assert_eq!(cpu[0].cores, Some(1.5));
        assert_eq!(cpu[0].rss_end_kb, Some(10));
        // A process that exited has no end reading: no figure, not a wrong one.
        assert_eq!(cpu[1].cores, None);
        let own = cpu_snapshot(&[("bench".into(), std::process::id())], clock_ticks());
        assert!(own[0].2.cpu_s.is_some());
    }

    #[test]
    fn reads_own_proc_stats() {
        let s = proc_stats("self", clock_ticks());
        assert!(s.rss_kb.is_some_and(|kb| kb > 0));
        assert!(s.threads.is_some_and(|t| t >= 1));
        assert!(s.cpu_s.is_some());
        assert!(system_busy_s(clock_ticks()).is_some());
    }
}
