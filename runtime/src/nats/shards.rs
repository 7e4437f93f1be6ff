//! The partitions of a namespace: which streams and consumer hold an execution's job and log.
//!
//! One JetStream stream stores its messages one at a time, one durable consumer hands out its
//! messages one request at a time, and one connection writes one socket: with every execution
//! in one jobs stream, one consumer and one events stream, unrelated executions queue behind
//! each other there however many processes and cores are added. A namespace may therefore
//! spread its work over `n` partitions (one by default, the layout of earlier versions). Each
//! partition has its own jobs stream, workers' consumer and events stream, so on a cluster
//! their leaders can sit on different nodes (the workers put partition k's on the k-th node:
//! `placement`); every worker pulls from every partition.
//!
//! | partition | events stream | log subjects | jobs stream | jobs subject | consumer |
//! | --- | --- | --- | --- | --- | --- |
//! | 0 | `{NS}_EVENTS` | `{ns}.events.{id}` | `{NS}_JOBS` | `{ns}.jobs` | `{ns}_workers` |
//! | k ≥ 1 | `{NS}_EVENTS_{k}` | `{ns}.events.{k}.{id}` | `{NS}_JOBS_{k}` | `{ns}.jobs.{k}` | `{ns}_workers_{k}` |
//!
//! (The type keeps its first name, `EventShards`: partitions began as shards of the events
//! stream, and the namespace's record keeps that name.)
//!
//! **Tenant lanes.** Within a partition, jobs are further split by tenant into `lanes` lanes,
//! each a subject of the partition's jobs stream with a durable consumer of its own, so one
//! tenant's backlog waits in its lane and never in front of another tenant's jobs (workers
//! serve the lanes in turn, see `worker::pool`). A tenant's lane is a stable hash of its name
//! modulo `lanes` ([`EventShards::lane_of`]); two tenants may share a lane (one in `lanes`
//! chance), and then share its turn. Lane 0 keeps the partition's names above; lane `j ≥ 1` is
//! subject `{jobs subject}.t{j}` and consumer `{consumer}_t{j}`:
//!
//! | partition | lane | jobs subject | consumer |
//! | --- | --- | --- | --- |
//! | 0 | 0 / j | `{ns}.jobs` / `{ns}.jobs.t{j}` | `{ns}_workers` / `{ns}_workers_t{j}` |
//! | k ≥ 1 | 0 / j | `{ns}.jobs.{k}` / `{ns}.jobs.{k}.t{j}` | `{ns}_workers_{k}` / `{ns}_workers_{k}_t{j}` |
//!
//! A namespace is created with [`DEFAULT_TENANT_LANES`] lanes, recorded beside the partition
//! count ([`LANES_METADATA_KEY`]); one created before lanes has none recorded and one lane, its
//! consumers without a filter, exactly as those versions left it.
//!
//! An execution's shard is its id (a UUID) read as a 128-bit big-endian integer, modulo `n`:
//! every process computes it alone, and it never changes. Every shard republishes what it
//! stores on the same `{ns}.stored.{id}`, so live readers do not care where a log lives.
//!
//! `n` is chosen when the namespace is created and recorded in the metadata of `{NS}_EVENTS`
//! ([`SHARDS_METADATA_KEY`]); every process adopts the recorded value, so processes can never
//! disagree on where a log lives. A namespace created before sharding has no record and one
//! shard: its logs stay where they are (shard 0's stream and subjects are the layout of those
//! versions). The count of an existing namespace cannot be changed (logs would move): a process
//! asking for another count explicitly refuses to start, naming both counts.

use protocol::ExecutionId;

use crate::error::StoreError;

/// Shards of a namespace created without an explicit count: the layout of versions before
/// sharding.
pub const DEFAULT_EVENT_SHARDS: u16 = 1;

/// Most shards a namespace may have.
pub const MAX_EVENT_SHARDS: u16 = 64;

/// The metadata key of `{NS}_EVENTS` recording the namespace's shard count.
pub const SHARDS_METADATA_KEY: &str = "mrt_event_shards";

/// Tenant lanes of a namespace created by this version (see the module docs).
pub const DEFAULT_TENANT_LANES: u16 = 8;

/// Most tenant lanes a namespace may have.
pub const MAX_TENANT_LANES: u16 = 64;

/// The metadata key of `{NS}_EVENTS` recording the namespace's tenant lanes per partition.
pub const LANES_METADATA_KEY: &str = "mrt_tenant_lanes";

/// Where the logs and jobs of one namespace live (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventShards {
    namespace: String,
    count: u16,
    lanes: u16,
}

impl EventShards {
    /// The layout of `namespace` with `count` shards (1 to [`MAX_EVENT_SHARDS`]).
    pub fn new(namespace: impl Into<String>, count: u16) -> Result<Self, StoreError> {
        if !(1..=MAX_EVENT_SHARDS).contains(&count) {
            return Err(StoreError::Misconfigured(format!(
                "the events stream may have 1 to {MAX_EVENT_SHARDS} shards, not {count}"
            )));
        }
        Ok(Self {
            namespace: namespace.into(),
            count,
            lanes: 1,
        })
    }

    /// This layout with `lanes` tenant lanes per partition (1 to [`MAX_TENANT_LANES`]).
    pub fn with_lanes(self, lanes: u16) -> Result<Self, StoreError> {
        if !(1..=MAX_TENANT_LANES).contains(&lanes) {
            return Err(StoreError::Misconfigured(format!(
                "a job partition may have 1 to {MAX_TENANT_LANES} tenant lanes, not {lanes}"
            )));
        }
        Ok(Self { lanes, ..self })
    }

    /// The layout of partition 0 alone, which every namespace has (its names are those of
    /// versions before partitions).
    pub(crate) fn first_of(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            count: 1,
            lanes: 1,
        }
    }

    /// How many tenant lanes each partition has.
    pub fn lanes(&self) -> u16 {
        self.lanes
    }

    /// The lane of tenant `tenant`: FNV-1a of its name modulo the lane count, so every
    /// process and version computes the same lane.
    pub fn lane_of(&self, tenant: &str) -> u16 {
        let hash = tenant.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        // Lossless: the remainder is below `lanes`, a u16.
        (hash % u64::from(self.lanes)) as u16
    }

    /// How many shards (streams) the namespace has.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// The shard holding the execution's log.
    pub fn shard_of(&self, id: &ExecutionId) -> u16 {
        // Lossless: the remainder is below `count`, a u16.
        (id.as_uuid().as_u128() % u128::from(self.count)) as u16
    }

    /// The name of shard `shard`'s stream.
    pub fn stream(&self, shard: u16) -> String {
        self.stream_name("EVENTS", shard)
    }

    /// `{NS}_{kind}`, numbered from 1 (0: the name alone, that of versions before numbers).
    fn stream_name(&self, kind: &str, n: u16) -> String {
        numbered(
            format!("{}_{kind}", self.namespace.to_ascii_uppercase()),
            "_",
            n,
        )
    }

    /// The subjects of shard `shard`'s stream (one per execution).
    pub fn subjects(&self, shard: u16) -> String {
        match shard {
            0 => format!("{}.events.*", self.namespace),
            k => format!("{}.events.{k}.*", self.namespace),
        }
    }

    /// The subject of the execution's log (one allocation: it is built for every append).
    pub fn subject(&self, id: &ExecutionId) -> String {
        match self.shard_of(id) {
            0 => format!("{}.events.{id}", self.namespace),
            k => format!("{}.events.{k}.{id}", self.namespace),
        }
    }

    /// The stream holding the execution's log.
    pub fn stream_of(&self, id: &ExecutionId) -> String {
        self.stream(self.shard_of(id))
    }

    /// The jobs stream of partition `partition`.
    pub fn jobs_stream(&self, partition: u16) -> String {
        self.stream_name("JOBS", partition)
    }

    /// The subject of partition `partition`'s jobs.
    pub fn jobs_subject(&self, partition: u16) -> String {
        numbered(format!("{}.jobs", self.namespace), ".", partition)
    }

    /// The workers' durable consumer of partition `partition`'s jobs stream (of its lane 0).
    pub fn jobs_consumer(&self, partition: u16) -> String {
        numbered(format!("{}_workers", self.namespace), "_", partition)
    }

    /// The subject of lane `lane` of partition `partition`'s jobs.
    pub fn jobs_lane_subject(&self, partition: u16, lane: u16) -> String {
        numbered(self.jobs_subject(partition), ".t", lane)
    }

    /// Every lane's subject of partition `partition`'s jobs stream, lane 0 first.
    pub fn jobs_subjects(&self, partition: u16) -> Vec<String> {
        (0..self.lanes)
            .map(|lane| self.jobs_lane_subject(partition, lane))
            .collect()
    }

    /// The workers' durable consumer of lane `lane` of partition `partition`.
    pub fn jobs_lane_consumer(&self, partition: u16, lane: u16) -> String {
        numbered(self.jobs_consumer(partition), "_t", lane)
    }

    /// Every shard's stream, shard 0 first.
    pub fn streams(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.count).map(|shard| self.stream(shard))
    }
}

/// Member `k` of a numbered family: `base` itself for 0 (the name every namespace had before
/// the family grew), `base{sep}{k}` after.
fn numbered(base: String, sep: &str, k: u16) -> String {
    match k {
        0 => base,
        k => format!("{base}{sep}{k}"),
    }
}

/// A count fixed when a namespace is created and recorded in the metadata of `{NS}_EVENTS`:
/// the shards, and the tenant lanes per partition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordedCount {
    /// The metadata key it is recorded under.
    pub key: &'static str,
    /// What a new namespace gets when the process asks for nothing.
    default: u16,
    /// The values a record may hold.
    min: u16,
    max: u16,
    /// What it counts, in the message refusing another count.
    unit: &'static str,
    /// Its name in the message about an invalid record.
    name: &'static str,
}

/// The shard count (`{NS}_EVENTS` of a version before sharding records none: one).
pub(crate) const SHARD_COUNT: RecordedCount = RecordedCount {
    key: SHARDS_METADATA_KEY,
    default: DEFAULT_EVENT_SHARDS,
    min: 0,
    max: u16::MAX,
    unit: "partition(s)",
    name: "shard count",
};

/// The tenant lanes per partition (a namespace created before lanes records none: one), of
/// which a new namespace gets [`DEFAULT_TENANT_LANES`].
pub(crate) const LANE_COUNT: RecordedCount = RecordedCount {
    key: LANES_METADATA_KEY,
    default: DEFAULT_TENANT_LANES,
    min: 1,
    max: MAX_TENANT_LANES,
    unit: "tenant lane(s) per partition",
    name: "tenant lane count",
};

impl RecordedCount {
    /// The count a process uses, from what `{NS}_EVENTS` records (`None`: no stream yet;
    /// `Some(None)`: a stream of a version before the count was recorded) and what the process
    /// asks for (`None`: whatever the namespace has, the default for a new one).
    pub(crate) fn agree(
        &self,
        namespace: &str,
        recorded: Option<Option<&str>>,
        wanted: Option<u16>,
    ) -> Result<u16, StoreError> {
        let recorded = match recorded {
            None => return Ok(wanted.unwrap_or(self.default)),
            Some(None) => 1,
            Some(Some(text)) => text
                .parse::<u16>()
                .ok()
                .filter(|n| (self.min..=self.max).contains(n))
                .ok_or_else(|| {
                    StoreError::Misconfigured(format!(
                        "the events stream of namespace {namespace} records an invalid {}",
                        self.name
                    ))
                })?,
        };
        match wanted {
            Some(wanted) if wanted != recorded => Err(StoreError::Misconfigured(format!(
                "namespace {namespace} has {recorded} {} and this process asks for {wanted}; \
                 the count is fixed when a namespace is created (leave the setting out to use \
                 the namespace's, or use another namespace)",
                self.unit
            ))),
            _ => Ok(recorded),
        }
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    fn id(hex: &str) -> ExecutionId {
        ExecutionId::from_uuid(Uuid::parse_str(hex).unwrap())
    }

    /// Checks that `shards` places `exec` in `shard`, whose stream is `stream` and whose
    /// subjects are `subjects` (with `exec`'s own subject the wildcard filled in).
    fn assert_placed(
        shards: &EventShards,
        exec: &ExecutionId,
        shard: u16,
        stream: &str,
        subjects: &str,
    ) {
        assert_eq!(shards.shard_of(exec), shard);
        assert_eq!(shards.stream_of(exec), stream);
        assert_eq!(shards.subjects(shard), subjects);
        assert_eq!(
            shards.subject(exec),
            subjects.replace('*', &exec.to_string())
        );
    }

    /// Checks the jobs stream, subject and consumer of `partition`, in that order.
    fn assert_jobs_names(shards: &EventShards, partition: u16, names: [&str; 3]) {
        assert_eq!(
            [
                shards.jobs_stream(partition),
                shards.jobs_subject(partition),
                shards.jobs_consumer(partition),
            ],
            names
        );
    }

    #[test]
    fn a_single_shard_is_the_layout_of_versions_before_sharding() {
        let one = EventShards::new("mrt", 1).unwrap();
        let exec = id("6f1c2a9e-0d4b-4c1e-9a57-3b2d8e4f7a10");
        assert_placed(&one, &exec, 0, "MRT_EVENTS", "mrt.events.*");
        assert_eq!(one.streams().collect::<Vec<_>>(), ["MRT_EVENTS"]);
        assert_jobs_names(&one, 0, ["MRT_JOBS", "mrt.jobs", "mrt_workers"]);
    }

    #[test]
    fn a_partition_has_its_own_jobs_stream_subject_and_consumer() {
        let four = EventShards::new("ab", 4).unwrap();
        assert_jobs_names(&four, 2, ["AB_JOBS_2", "ab.jobs.2", "ab_workers_2"]);
        // Partition 0's subject must not overlap another partition's (the streams would
        // refuse to be created): `ab.jobs` is not `ab.jobs.*`.
        assert_ne!(four.jobs_subject(0), four.jobs_subject(1));
    }

    #[test]
    fn the_shard_is_the_id_modulo_the_count_and_names_follow_it() {
        let four = EventShards::new("mrt", 4).unwrap();
        // The last byte (0x13 = 19) decides modulo 4: 19 % 4 = 3. Pinned: a change would move
        // every stored log.
        let exec = id("00000000-0000-4000-8000-000000000013");
        assert_placed(&four, &exec, 3, "MRT_EVENTS_3", "mrt.events.3.*");
        let zero = id("00000000-0000-4000-8000-000000000014");
        assert_eq!(four.subject(&zero), format!("mrt.events.{zero}"));
        assert_eq!(
            four.streams().collect::<Vec<_>>(),
            ["MRT_EVENTS", "MRT_EVENTS_1", "MRT_EVENTS_2", "MRT_EVENTS_3"]
        );
        let three = EventShards::new("mrt", 3).unwrap();
        let big = id("ffffffff-ffff-4fff-bfff-ffffffffffff");
        assert_eq!(
            u128::from(three.shard_of(&big)),
            big.as_uuid().as_u128() % 3
        );
    }

    #[test]
    fn random_ids_spread_over_every_shard() {
        let four = EventShards::new("mrt", 4).unwrap();
        let mut counts = [0u32; 4];
        for _ in 0..4000 {
            counts[usize::from(four.shard_of(&ExecutionId::new_random()))] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn counts_out_of_range_are_refused() {
        assert!(EventShards::new("mrt", 0).is_err());
        assert!(EventShards::new("mrt", MAX_EVENT_SHARDS + 1).is_err());
        assert!(EventShards::new("mrt", MAX_EVENT_SHARDS).is_ok());
    }

    #[test]
    fn the_recorded_count_wins_and_an_explicit_other_count_is_refused() {
        for count in [&SHARD_COUNT, &LANE_COUNT] {
            let name = count.name;
            assert_eq!(count.agree("ns", None, None).unwrap(), count.default);
            // `Some(None)`: a namespace of a version before the count was recorded (one).
            for (recorded, wanted, expected) in [
                (None, Some(2), 2),
                (Some(None), None, 1),
                (Some(None), Some(1), 1),
                (Some(Some("4")), None, 4),
                (Some(Some("4")), Some(4), 4),
            ] {
                let agreed = count.agree("ns", recorded, wanted).unwrap();
                assert_eq!(agreed, expected, "{name} {recorded:?} {wanted:?}");
            }
            let Err(StoreError::Misconfigured(message)) = count.agree("ns", Some(None), Some(4))
            else {
                panic!("{name}: a namespace of one accepted 4");
            };
            assert!(
                message.contains(&format!("has 1 {}", count.unit)),
                "{message}"
            );
            assert!(message.contains("asks for 4"), "{message}");
            assert!(count.agree("ns", Some(Some("x")), None).is_err(), "{name}");
        }
        assert!(LANE_COUNT.agree("ns", Some(Some("0")), None).is_err());
    }

    #[test]
    fn a_lane_has_its_own_subject_and_consumer_and_lane_zero_keeps_the_partition_names() {
        let lanes = EventShards::new("mrt", 2).unwrap().with_lanes(4).unwrap();
        assert_eq!(
            lanes.jobs_subjects(0),
            ["mrt.jobs", "mrt.jobs.t1", "mrt.jobs.t2", "mrt.jobs.t3"]
        );
        assert_eq!(lanes.jobs_lane_subject(1, 2), "mrt.jobs.1.t2");
        assert_eq!(lanes.jobs_lane_consumer(0, 0), "mrt_workers");
        assert_eq!(lanes.jobs_lane_consumer(1, 3), "mrt_workers_1_t3");
        // One lane: the layout of versions before lanes.
        let one = EventShards::new("mrt", 2).unwrap();
        assert_eq!(one.lanes(), 1);
        assert_eq!(one.jobs_subjects(1), ["mrt.jobs.1"]);
        assert_eq!(one.lane_of("acme"), 0);
    }

    #[test]
    fn a_tenant_lane_is_a_stable_hash_that_spreads_tenants() {
        let eight = EventShards::new("mrt", 1).unwrap().with_lanes(8).unwrap();
        // Pinned: a change would move a tenant's waiting jobs out of its lane's consumer.
        assert_eq!(eight.lane_of("default"), eight.lane_of("default"));
        let lanes: std::collections::BTreeSet<u16> = (0..64)
            .map(|i| eight.lane_of(&format!("tenant-{i}")))
            .collect();
        assert_eq!(lanes.len(), 8, "{lanes:?}");
        assert!(EventShards::new("mrt", 1).unwrap().with_lanes(0).is_err());
        assert!(
            EventShards::new("mrt", 1)
                .unwrap()
                .with_lanes(MAX_TENANT_LANES + 1)
                .is_err()
        );
    }
}
