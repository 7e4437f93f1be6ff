//! Leader placement: which node of a cluster leads each partition.
//!
//! JetStream elects the leader of every replicated stream and consumer by itself. Left alone,
//! a namespace's partitions can all be led by one node, and after a node restarts they always
//! are: its leaders moved to the others while it was away, and nothing moves them back. That
//! one node then stores every append and hands out every job while the others only follow, so
//! partitions would spread the work over streams but not over machines.
//!
//! This task gives partition `k` a place: the `k mod r`-th of its group's `r` peers in name
//! order. Every group of the partition (its events stream, its jobs stream and its tenant
//! lanes' consumers) has that place, so a partition is led from one node, and with as many
//! partitions as nodes (or a multiple) every node leads its share. On a 3-node cluster with
//! streams of 3 replicas, partition 0 sits on the first node by name, partition 1 on the
//! second, partition 2 on the third, partition 3 on the first again, and so on.
//!
//! Every `interval` (plus up to a quarter of it at random, so processes do not ask together)
//! it reads each group's info, which the group's leader answers, and asks a leader to step
//! down in favour of the group's place (`LEADER.STEPDOWN` with a preferred server, nats-server
//! 2.11 or newer) when:
//! - the group was away from its place at the previous reading too: an election in progress, or
//!   one just ended, is left to settle;
//! - its place is a peer that is current with the leader and not offline: a node that is
//!   catching up after a restart is moved to only once it has caught up.
//!
//! A move is one election of that one group: its writes and pulls pause for about as long as
//! an election takes, and are retried as in any election. Several processes may run this task
//! at once: they agree on every place, and a leader asked to step down for itself refuses
//! harmlessly. A namespace with one partition, or streams of one replica, is left alone: it
//! has nothing to spread.

use std::collections::HashSet;
use std::time::Duration;

use async_nats::jetstream;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{EventShards, NatsBackend};

/// One stream or consumer of a partition: the groups whose leader this task places.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Group {
    Stream { stream: String },
    Consumer { stream: String, consumer: String },
}

impl Group {
    /// The JetStream API subject (after `$JS.API.`) of `verb` on this group: `INFO` or
    /// `LEADER.STEPDOWN`.
    fn api(&self, verb: &str) -> String {
        match self {
            Self::Stream { stream } => format!("STREAM.{verb}.{stream}"),
            Self::Consumer { stream, consumer } => format!("CONSUMER.{verb}.{stream}.{consumer}"),
        }
    }
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stream { stream } => write!(f, "stream {stream}"),
            Self::Consumer { stream, consumer } => write!(f, "consumer {consumer} of {stream}"),
        }
    }
}

/// Where a group's leadership stands, as its info tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leadership {
    /// The leader's server name (`None` during an election).
    pub(crate) leader: Option<String>,
    /// The other peers.
    pub(crate) followers: Vec<Follower>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Follower {
    pub(crate) name: String,
    /// Up to date with the leader and not offline.
    pub(crate) ready: bool,
}

impl Leadership {
    /// The place of partition `partition`'s groups among these peers: the `partition mod r`-th
    /// by name. `None` for a group of one peer.
    pub(crate) fn place(&self, partition: u16) -> Option<&str> {
        let leader = self.leader.as_deref()?;
        let mut peers: Vec<&str> = self.followers.iter().map(|f| f.name.as_str()).collect();
        peers.push(leader);
        peers.sort_unstable();
        peers.dedup();
        if peers.len() < 2 {
            return None;
        }
        Some(peers[usize::from(partition) % peers.len()])
    }

    /// The place, when the leader is not there.
    pub(crate) fn away_from(&self, partition: u16) -> Option<&str> {
        self.place(partition)
            .filter(|place| self.leader.as_deref() != Some(*place))
    }

    /// The peer to hand leadership to, when the leader is away from the place and the place
    /// is a ready follower.
    pub(crate) fn move_to(&self, partition: u16) -> Option<&str> {
        let place = self.away_from(partition)?;
        self.followers
            .iter()
            .any(|f| f.name == place && f.ready)
            .then_some(place)
    }
}

/// The groups of every partition of a namespace laid out as `events`, with their partition:
/// each events stream, jobs stream and lane consumer.
fn groups_of(events: &EventShards) -> Vec<(Group, u16)> {
    let mut groups = Vec::new();
    for partition in 0..events.count() {
        groups.push((
            Group::Stream {
                stream: events.stream(partition),
            },
            partition,
        ));
        let jobs = events.jobs_stream(partition);
        groups.push((
            Group::Stream {
                stream: jobs.clone(),
            },
            partition,
        ));
        for lane in 0..events.lanes() {
            groups.push((
                Group::Consumer {
                    stream: jobs.clone(),
                    consumer: events.jobs_lane_consumer(partition, lane),
                },
                partition,
            ));
        }
    }
    groups
}

/// Misplaced groups from one reading to the next: a group moves only when it was away from
/// its place at two readings in a row.
#[derive(Debug, Default)]
pub(crate) struct Placer {
    away: HashSet<Group>,
}

impl Placer {
    /// Takes one reading of every group (`None`: its info could not be read) and returns the
    /// moves to make now: `(group, peer to lead it)`.
    pub(crate) fn reading<'a>(
        &mut self,
        groups: impl IntoIterator<Item = (&'a Group, u16, Option<&'a Leadership>)>,
    ) -> Vec<(Group, String)> {
        let mut away = HashSet::new();
        let mut moves = Vec::new();
        for (group, partition, leadership) in groups {
            let Some(leadership) = leadership else {
                continue;
            };
            if leadership.away_from(partition).is_none() {
                continue;
            }
            if self.away.contains(group)
                && let Some(to) = leadership.move_to(partition)
            {
                moves.push((group.clone(), to.to_owned()));
            }
            away.insert(group.clone());
        }
        self.away = away;
        moves
    }
}

/// The part of a stream's or consumer's info this task reads.
#[derive(Debug, Deserialize)]
struct Info {
    #[serde(default)]
    cluster: Option<ClusterInfo>,
}

#[derive(Debug, Deserialize)]
struct ClusterInfo {
    #[serde(default)]
    leader: Option<String>,
    #[serde(default)]
    replicas: Vec<PeerInfo>,
}

#[derive(Debug, Deserialize)]
struct PeerInfo {
    name: String,
    #[serde(default)]
    current: bool,
    #[serde(default)]
    offline: bool,
}

/// A JetStream API answer: the info, or an error (an unknown consumer, say).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Answer<T> {
    Failed { error: serde_json::Value },
    Ok(T),
}

/// The leadership of `group` now (`None` when it cannot be read: no leader to answer during
/// an election, a consumer no worker created yet, a server away).
async fn read(js: &jetstream::Context, group: &Group) -> Option<Leadership> {
    // `{}`: a consumer's info refuses any body but an empty one (`null` included).
    let empty = serde_json::Map::new();
    let answer: Answer<Info> = js.request(group.api("INFO"), &empty).await.ok()?;
    let Answer::Ok(info) = answer else {
        return None;
    };
    let cluster = info.cluster?;
    Some(Leadership {
        leader: cluster.leader,
        followers: cluster
            .replicas
            .into_iter()
            .map(|p| Follower {
                ready: p.current && !p.offline,
                name: p.name,
            })
            .collect(),
    })
}

/// Asks `group`'s leader to hand leadership to `to`.
async fn step_down(js: &jetstream::Context, group: &Group, to: &str) -> Result<(), String> {
    let request = serde_json::json!({ "placement": { "preferred": to } });
    let answer: Answer<serde_json::Value> = js
        .request(group.api("LEADER.STEPDOWN"), &request)
        .await
        .map_err(|e| e.to_string())?;
    match answer {
        Answer::Ok(_) => Ok(()),
        Answer::Failed { error } => Err(error["description"]
            .as_str()
            .unwrap_or("refused")
            .to_owned()),
    }
}

/// Runs leader placement for `backend`'s namespace every `interval` until `stop` (see the
/// module's documentation). `None` (nothing started) when the namespace has one partition or
/// its streams one replica.
pub fn spawn_leader_placement(
    backend: &NatsBackend,
    interval: Duration,
    stop: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    if backend.events.count() < 2 || backend.settings.replicas < 2 {
        return None;
    }
    let js = backend.jetstream.clone();
    let groups = groups_of(&backend.events);
    Some(tokio::spawn(async move {
        let mut placer = Placer::default();
        loop {
            let pause = interval + jitter(interval / 4);
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
            let mut readings = Vec::with_capacity(groups.len());
            for (group, _) in &groups {
                readings.push(read(&js, group).await);
            }
            let moves =
                placer.reading(groups.iter().zip(&readings).map(
                    |((group, partition), leadership)| (group, *partition, leadership.as_ref()),
                ));
            for (group, to) in moves {
                match step_down(&js, &group, &to).await {
                    Ok(()) => {
                        tracing::info!(%group, leader = %to, "moved a partition's leader to its place")
                    }
                    Err(e) => tracing::debug!(%group, leader = %to, error = %e, "leader not moved"),
                }
            }
        }
    }))
}

/// The groups of a namespace laid out as `events` that are not led from their place now (one
/// whose leadership cannot be read counts as away), described as `{group} led by {leader},
/// place {place}`: empty once every partition is led from its place. For tools that wait for
/// placement (the benchmark harness) and tests.
pub async fn misplaced_leaders(js: &jetstream::Context, events: &EventShards) -> Vec<String> {
    let mut away = Vec::new();
    for (group, partition) in groups_of(events) {
        let Some(leadership) = read(js, &group).await else {
            away.push(format!("{group}: leadership unknown"));
            continue;
        };
        if let Some(place) = leadership.away_from(partition) {
            let leader = leadership.leader.as_deref().unwrap_or("nobody");
            away.push(format!("{group} led by {leader}, place {place}"));
        }
    }
    away
}

/// A random pause of up to `most`.
fn jitter(most: Duration) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    let nanos = u64::try_from(most.as_nanos()).unwrap_or(u64::MAX).max(1);
    Duration::from_nanos(RandomState::new().hash_one(0u8) % nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leadership(leader: Option<&str>, followers: &[(&str, bool)]) -> Leadership {
        Leadership {
            leader: leader.map(str::to_owned),
            followers: followers
                .iter()
                .map(|(name, ready)| Follower {
                    name: (*name).to_owned(),
                    ready: *ready,
                })
                .collect(),
        }
    }

    fn stream(name: &str) -> Group {
        Group::Stream {
            stream: name.to_owned(),
        }
    }

    #[test]
    fn a_partitions_place_is_its_index_among_the_peers_by_name() {
        let l = leadership(Some("n1"), &[("n2", true), ("n0", true)]);
        assert_eq!(l.place(0), Some("n0"));
        assert_eq!(l.place(1), Some("n1"));
        assert_eq!(l.place(2), Some("n2"));
        assert_eq!(l.place(3), Some("n0"));
        // A group of one peer, or during an election, has no place to go to.
        assert_eq!(leadership(Some("n0"), &[]).place(1), None);
        assert_eq!(leadership(None, &[("n0", true)]).place(1), None);
    }

    #[test]
    fn a_leader_moves_only_to_a_ready_follower_in_its_place() {
        let l = leadership(Some("n1"), &[("n2", true), ("n0", false)]);
        assert_eq!(l.move_to(1), None, "already in place");
        assert_eq!(l.move_to(2), Some("n2"));
        assert_eq!(l.move_to(0), None, "n0 is catching up");
    }

    #[test]
    fn a_group_moves_after_two_readings_away_from_its_place_in_a_row() {
        let events = stream("E_1");
        let jobs = stream("J_1");
        let away = leadership(Some("n0"), &[("n1", true), ("n2", true)]);
        let placed = leadership(Some("n1"), &[("n0", true), ("n2", true)]);
        let mut placer = Placer::default();
        // First reading away: noted, nothing moves.
        let moves = placer.reading([(&events, 1, Some(&away)), (&jobs, 1, Some(&away))]);
        assert!(moves.is_empty(), "{moves:?}");
        // Second: the events stream is still away and moves; the jobs stream got there alone.
        let moves = placer.reading([(&events, 1, Some(&away)), (&jobs, 1, Some(&placed))]);
        assert_eq!(moves, [(events.clone(), "n1".to_owned())]);
        // A reading that cannot be taken (an election) starts the count again.
        let moves = placer.reading([(&events, 1, None)]);
        assert!(moves.is_empty());
        let moves = placer.reading([(&events, 1, Some(&away))]);
        assert!(moves.is_empty(), "{moves:?}");
        let moves = placer.reading([(&events, 1, Some(&away))]);
        assert_eq!(moves.len(), 1);
    }

    #[test]
    fn every_stream_and_lane_consumer_of_a_partition_is_placed_with_it() {
        let events = EventShards::new("mrt", 2).unwrap().with_lanes(2).unwrap();
        let groups = groups_of(&events);
        let of = |partition| -> Vec<String> {
            groups
                .iter()
                .filter(|(_, p)| *p == partition)
                .map(|(g, _)| g.api("INFO"))
                .collect()
        };
        assert_eq!(
            of(0),
            [
                "STREAM.INFO.MRT_EVENTS",
                "STREAM.INFO.MRT_JOBS",
                "CONSUMER.INFO.MRT_JOBS.mrt_workers",
                "CONSUMER.INFO.MRT_JOBS.mrt_workers_t1",
            ]
        );
        assert_eq!(
            of(1),
            [
                "STREAM.INFO.MRT_EVENTS_1",
                "STREAM.INFO.MRT_JOBS_1",
                "CONSUMER.INFO.MRT_JOBS_1.mrt_workers_1",
                "CONSUMER.INFO.MRT_JOBS_1.mrt_workers_1_t1",
            ]
        );
        assert_eq!(groups.len(), 8);
    }

    #[test]
    fn an_api_error_is_told_from_an_info() {
        let failed: Answer<Info> =
            serde_json::from_str(r#"{"type":"x","error":{"code":404,"description":"no"}}"#)
                .unwrap();
        assert!(matches!(failed, Answer::Failed { .. }));
        let info: Answer<Info> = serde_json::from_str(
            r#"{"cluster":{"leader":"n2","replicas":[{"name":"n0","current":true,"active":1},{"name":"n1","current":false,"offline":true,"active":1}]}}"#,
        )
        .unwrap();
        let Answer::Ok(info) = info else {
            panic!("an info read as an error");
        };
        let cluster = info.cluster.unwrap();
        assert_eq!(cluster.leader.as_deref(), Some("n2"));
        assert_eq!(cluster.replicas.len(), 2);
        assert!(cluster.replicas[1].offline);
    }
}
