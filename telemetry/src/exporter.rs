//! The process-wide metrics recorder and the `/metrics` text.
//!
//! One recorder per process (the `metrics` facade allows one): [`MetricsExporter::install`]
//! installs it the first time and hands out the same handle afterwards, so a test that starts
//! several gateways in one process gets one shared registry instead of a failure. Rendering also
//! refreshes `process_cpu_seconds_total` and `process_resident_memory_bytes` (read from `/proc`
//! by `metrics-process`), so they cost nothing between scrapes. Histogram samples are folded
//! into their buckets every 5 s on a thread of its own, so memory stays flat without scrapes.

use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::metric;

/// A cloneable handle on the process's metrics registry.
#[derive(Clone)]
pub struct MetricsExporter {
    inner: Arc<Inner>,
}

struct Inner {
    handle: PrometheusHandle,
    process: metrics_process::Collector,
}

impl std::fmt::Debug for MetricsExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsExporter").finish_non_exhaustive()
    }
}

static EXPORTER: OnceLock<MetricsExporter> = OnceLock::new();

impl MetricsExporter {
    /// Installs the Prometheus recorder (once per process) and registers the catalogue.
    pub fn install() -> MetricsExporter {
        EXPORTER.get_or_init(build).clone()
    }

    /// The Prometheus text exposition of every metric of this process.
    pub fn render(&self) -> String {
        self.inner.process.collect();
        // Histograms are accumulated per thread and merged here, not on the hot path.
        self.inner.handle.run_upkeep();
        self.inner.handle.render()
    }
}

fn build() -> MetricsExporter {
    // Only an empty bucket list is refused, and the catalogue has none; should that change,
    // default buckets are better than no metrics.
    let builder = metric::HISTOGRAMS
        .iter()
        .try_fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
            builder.set_buckets_for_metric(Matcher::Full((*name).to_owned()), buckets)
        })
        .unwrap_or_else(|err| {
            tracing::warn!(error = %err, "histogram buckets rejected; using defaults");
            PrometheusBuilder::new()
        });
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    spawn_upkeep(handle.clone());
    if metrics::set_global_recorder(recorder).is_err() {
        tracing::warn!("a metrics recorder was already installed; /metrics will be incomplete");
    }
    let process = metrics_process::Collector::default();
    process.describe();
    metric::register();
    MetricsExporter {
        inner: Arc::new(Inner { handle, process }),
    }
}

/// How often histogram samples are folded into their buckets between scrapes.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Folds recorded histogram samples into their buckets every [`UPKEEP_INTERVAL`] on a thread of
/// its own. The recorder keeps each sample until upkeep runs: without this, a process nobody
/// scrapes would hold every sample it ever recorded.
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_INTERVAL);
                handle.run_upkeep();
            }
        });
    if let Err(err) = spawned {
        tracing::warn!(error = %err, "no metrics upkeep thread; histograms fold only on scrape");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_and_process_metric_is_exported_from_startup() {
        let text = MetricsExporter::install().render();
        for name in [
            metric::EXECUTIONS_TOTAL,
            metric::JOB_REDELIVERIES_TOTAL,
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "{name} missing from:\n{text}"
            );
        }
        assert!(
            text.contains("mrt_executions_total{outcome=\"failed\",code=\"deadline_exceeded\"} 0")
        );
    }

    #[test]
    fn histograms_use_the_catalogue_buckets() {
        let exporter = MetricsExporter::install();
        metrics::histogram!(metric::EVENT_APPEND_DURATION_SECONDS).record(0.000_07);
        let text = exporter.render();
        assert!(
            text.contains("mrt_event_append_duration_seconds_bucket{le=\"0.0001\"} 1"),
            "{text}"
        );
        assert!(text.contains("mrt_event_append_duration_seconds_bucket{le=\"0.00005\"} 0"));
    }
}
