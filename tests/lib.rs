//! Harness for end-to-end tests: the real binaries over private NATS and Redis, from
//! `testkit::gateway::process`, and the partitioned layout the fault tests also run on.
// Test support: a broken expectation is a failed test.
#![allow(clippy::expect_used, clippy::panic)]

pub use testkit::gateway::process::*;

use protocol::ExecutionId;
use runtime::nats::EventShards;
use serde_json::Value;

/// The partition count of the fault tests' partitioned runs: enough that an execution's jobs
/// stream, consumer, events stream and connection lane are not partition 0's.
pub const PARTITIONS: u16 = 4;

/// The most executions [`Layout::submit_followed`] submits. The partition is uniform over
/// random ids: 64 tries leave one chance in 10^8 of missing it with 4 partitions.
pub const FOLLOW_SUBMITS: usize = 64;

/// How the jobs and logs of a test's namespace are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The default: one partition, the names of versions before partitions.
    Single,
    /// [`PARTITIONS`] partitions (`MODEL_RUNTIME_PARTITIONS`), every process of the test
    /// started with that count; the executions a test follows are taken from the last one.
    Partitioned,
}

impl Layout {
    /// Starts NATS and Redis for `config` with this layout for every process started later.
    pub fn cluster(self, config: &Value) -> Cluster {
        let mut cluster = Cluster::start(config);
        if self == Layout::Partitioned {
            cluster
                .extra_env
                .push(("MODEL_RUNTIME_PARTITIONS".into(), PARTITIONS.to_string()));
        }
        cluster
    }

    /// How many partitions the namespace has.
    pub fn partitions(self) -> u16 {
        match self {
            Layout::Single => 1,
            Layout::Partitioned => PARTITIONS,
        }
    }

    /// The partition `id`'s job and log belong to (the layout's own rule,
    /// `runtime::nats::EventShards::shard_of`).
    pub fn partition_of(self, id: &str) -> u16 {
        let id: ExecutionId = id.parse().expect("an execution id");
        EventShards::new("e2e", self.partitions())
            .expect("a valid partition count")
            .shard_of(&id)
    }

    /// The partition the executions a test follows are taken from: the last one, so that with
    /// several partitions nothing of theirs goes through partition 0's streams, consumer or
    /// connection lane.
    pub fn followed_partition(self) -> u16 {
        self.partitions() - 1
    }

    /// Submits `body` to `base` until an execution of [`Self::followed_partition`] is
    /// accepted and returns its id. With one partition that is the first one. The others run
    /// as well, up to [`FOLLOW_SUBMITS`]` - 1` of them (8 or more in one run of 10 with 4
    /// partitions): a test whose followed execution must start at once gives the worker room
    /// for all of them.
    pub async fn submit_followed(self, base: &str, body: &Value) -> String {
        for _ in 0..FOLLOW_SUBMITS {
            let id = submit_accepted(base, body).await;
            if self.partition_of(&id) == self.followed_partition() {
                return id;
            }
        }
        panic!(
            "no execution of partition {} in {FOLLOW_SUBMITS} submits",
            self.followed_partition()
        );
    }
}
