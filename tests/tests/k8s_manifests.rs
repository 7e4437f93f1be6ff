//! The Kubernetes base (`deploy/k8s/base`) agrees with the runtime's layout: the KEDA
//! `ScaledObject` that scales the workers lists exactly the jobs streams and consumers of the
//! namespace the gateways and workers create (its partitions, each with the default tenant
//! lanes), so a trigger never names a consumer that does not exist and no lane goes unwatched.
//! Names come from `runtime::nats::EventShards`, the code that creates them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use runtime::nats::{DEFAULT_TENANT_LANES, EventShards};

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
fn the_worker_triggers_watch_every_lane_of_every_partition_and_nothing_else() {
    let gateway = base("gateway-deployment.yaml");
    let worker = base("worker-deployment.yaml");
    let namespace = env_value(&gateway, "MODEL_RUNTIME_NAMESPACE");
    assert_eq!(env_value(&worker, "MODEL_RUNTIME_NAMESPACE"), namespace);
    let partitions: u16 = env_value(&gateway, "MODEL_RUNTIME_PARTITIONS")
        .parse()
        .unwrap();
    assert_eq!(
        env_value(&worker, "MODEL_RUNTIME_PARTITIONS"),
        partitions.to_string(),
        "gateways and workers must agree: a process asking another count refuses to start"
    );
    let layout = EventShards::new(namespace, partitions)
        .unwrap()
        .with_lanes(DEFAULT_TENANT_LANES)
        .unwrap();
    let expected: BTreeSet<(String, String)> = (0..partitions)
        .flat_map(|p| {
            let layout = &layout;
            (0..DEFAULT_TENANT_LANES)
                .map(move |lane| (layout.jobs_stream(p), layout.jobs_lane_consumer(p, lane)))
        })
        .collect();

    let scaled = base("worker-scaledobject.yaml");
    let streams = values(&scaled, "stream");
    let consumers = values(&scaled, "consumer");
    assert_eq!(streams.len(), consumers.len());
    let listed: Vec<(String, String)> = streams
        .iter()
        .zip(&consumers)
        .map(|(s, c)| (s.to_string(), c.to_string()))
        .collect();
    let unique: BTreeSet<(String, String)> = listed.iter().cloned().collect();
    assert_eq!(unique.len(), listed.len(), "a consumer listed twice");
    assert_eq!(unique, expected);
    let triggers = scaled
        .lines()
        .filter(|l| l.trim() == "- type: nats-jetstream")
        .count();
    assert_eq!(
        triggers,
        expected.len(),
        "one nats-jetstream trigger per consumer"
    );
}
