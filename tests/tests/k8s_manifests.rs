//! The Kubernetes base (`deploy/k8s/base`) agrees with the runtime: gateways and workers ask for
//! the same namespace and partitions, and the KEDA `ScaledObject` that scales the workers reads
//! the queue's depth where the workers serve it: the gauge `mrt_jobs_pending` of the workers'
//! admin endpoint, through a Service that selects the worker pods on their admin port, with a
//! target of the executions one worker pod runs at once. (`tests/tests/autoscaling.rs` checks
//! that the gauge counts every partition and tenant lane.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

fn base(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/k8s/base")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The value of the `name: NAME` entry of a container's `env` list (the line after it).
fn env_value(manifest: &str, name: &str) -> String {
    let lines: Vec<&str> = manifest.lines().map(str::trim).collect();
    let at = lines
        .iter()
        .position(|l| *l == format!("- name: {name}"))
        .unwrap_or_else(|| panic!("no {name} in the manifest"));
    lines[at + 1]
        .strip_prefix("value: ")
        .unwrap_or_else(|| panic!("{name} has no literal value"))
        .trim_matches('"')
        .to_string()
}

/// Every `key: value` of the manifest with key `key`, in order.
fn values<'a>(manifest: &'a str, key: &str) -> Vec<&'a str> {
    manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
        .map(|v| v.trim_matches('"'))
        .collect()
}

#[test]
fn gateways_and_workers_ask_for_the_same_namespace_and_partitions() {
    let gateway = base("gateway-deployment.yaml");
    let worker = base("worker-deployment.yaml");
    for name in ["MODEL_RUNTIME_NAMESPACE", "MODEL_RUNTIME_PARTITIONS"] {
        assert_eq!(
            env_value(&gateway, name),
            env_value(&worker, name),
            "{name} differs between gateways and workers: they would not share a namespace"
        );
    }
    let partitions: u16 = env_value(&worker, "MODEL_RUNTIME_PARTITIONS")
        .parse()
        .unwrap();
    assert!(runtime::nats::EventShards::new("mrt", partitions).is_ok());
}

#[test]
fn keda_scales_the_workers_on_the_queue_they_serve_one_pod_per_slots() {
    let worker = base("worker-deployment.yaml");
    let service = base("worker-service.yaml");
    let scaled = base("worker-scaledobject.yaml");

    // One trigger: the Metrics API scaler on the workers' Prometheus exposition.
    assert_eq!(values(&scaled, "- type"), ["metrics-api"]);
    assert_eq!(values(&scaled, "format"), ["prometheus"]);
    assert_eq!(
        values(&scaled, "valueLocation"),
        [telemetry::metric::JOBS_PENDING]
    );
    // A pod per MODEL_RUNTIME_WORKERS jobs, the executions a worker pod runs at once.
    assert_eq!(
        values(&scaled, "targetValue"),
        [env_value(&worker, "MODEL_RUNTIME_WORKERS")]
    );

    // The URL names the Service, with a namespace (KEDA's operator runs in its own), on the
    // port the Service maps to the workers' admin port.
    let [url] = values(&scaled, "url")[..] else {
        panic!("one url")
    };
    let rest = url
        .strip_prefix("http://")
        .expect("plain http inside the cluster");
    let (authority, path) = rest.split_once('/').unwrap();
    assert_eq!(path, "metrics");
    let (host, port) = authority.split_once(':').unwrap();
    let labels: Vec<&str> = host.split('.').collect();
    assert_eq!(
        labels.len(),
        5,
        "SERVICE.NAMESPACE.svc.cluster.local: {host}"
    );
    assert_eq!(labels[2..], ["svc", "cluster", "local"]);
    assert_eq!(values(&service, "name")[0], labels[0], "the Service's name");
    assert_eq!(values(&service, "port"), [port]);
    assert_eq!(values(&service, "targetPort"), ["admin"]);
    // The admin port is the one the workers listen on, and the Service selects their pods.
    let admin_port = env_value(&worker, "MODEL_RUNTIME_ADMIN_PORT");
    assert_eq!(values(&worker, "containerPort"), [admin_port.as_str()]);
    assert_eq!(
        values(&worker, "- name")
            .iter()
            .filter(|n| **n == "admin")
            .count(),
        1,
        "the worker container's port named admin"
    );
    for label in ["app.kubernetes.io/name", "app.kubernetes.io/component"] {
        let selected = values(&service, label);
        let pods = values(&worker, label);
        assert!(!selected.is_empty() && pods.contains(&selected[0]));
        assert!(selected.iter().all(|v| *v == selected[0]));
    }
    assert_eq!(values(&service, "app.kubernetes.io/component")[0], "worker");
}
