//! C5 split cache (shards): 30,000 ConfigMaps (600 in quick mode); this
//! crate's controller as 1 and 3 replicas (processes), each with its cache
//! whole and split. Figures per variant: objects and resident memory per
//! replica once every object was reconciled once, the coordinator's bytes
//! per object (split: its resident memory beyond the others' mean, per
//! object), watch events the API server sent, creation-to-first-reconcile
//! p50/p99 of objects created once the group is steady; and, split with 3
//! replicas, the label patches when a fourth joins (3 to 4). The verdict:
//! with split caches, each of 3 replicas at most 0.4x of one unsplit
//! replica's memory beyond an empty replica's.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Api;
use kube_client::api::{DeleteParams, PostParams};
use tokio_workqueue_kube::shard::owner;

use super::peers::{ApiLoad, Line, Peer, Running, unix_nanos};
use super::{ALL_TIMEOUT, Bench, OURS, name};

/// The namespace of C5's objects, and of an empty replica's.
const NS: &str = "crb-shards";
const EMPTY_NS: &str = "crb-shards-empty";
pub(crate) const WORKLOAD: &str = "C5";

/// The owner of object `name` of C5's namespace among `ids`.
fn owner_of<'a>(name: &str, ids: &'a [String]) -> Option<&'a str> {
    owner(&format!("{NS}/{name}"), ids)
}

/// The objects of `names` that `id` owns among `ids`.
fn share(names: &HashSet<String>, ids: &[String], id: &str) -> HashSet<String> {
    names
        .iter()
        .filter(|n| owner_of(n, ids) == Some(id))
        .cloned()
        .collect()
}

/// One replica of a C5 group.
struct Replica {
    identity: String,
    run: Running,
    held: usize,
}

impl Bench {
    fn c5_n(&self) -> usize {
        if self.opts.quick { 600 } else { 30_000 }
    }

    /// Ours as replica `identity` of `group`, its cache split or not.
    fn shard_peer(&self, group: &str, identity: &str, split: bool) -> Peer {
        let ours = self
            .peers
            .iter()
            .find(|p| p.name == OURS)
            .expect("this crate's controller among the peers");
        let mut args = ours.args.clone();
        args.extend([
            "--shards".into(),
            group.into(),
            "--identity".into(),
            identity.into(),
        ]);
        if split {
            args.push("--split-cache".into());
        }
        match &self.opts.heaptrack {
            Some(dir) if split => {
                std::fs::create_dir_all(dir).expect("the --heaptrack directory");
                let out = dir.join(format!("{group}-{identity}"));
                let mut wrapped = vec!["-o".into(), out.display().to_string()];
                wrapped.push(ours.program.display().to_string());
                wrapped.extend(args);
                Peer {
                    name: OURS,
                    program: "heaptrack".into(),
                    args: wrapped,
                }
            }
            _ => Peer {
                name: OURS,
                program: ours.program.clone(),
                args,
            },
        }
    }

    fn start_replica(&self, ns: &str, group: &str, i: usize, split: bool) -> Replica {
        let identity = format!("r{i}");
        let peer = self.shard_peer(group, &identity, split);
        Replica {
            run: self.start(&peer, ns),
            identity,
            held: 0,
        }
    }

    /// Reads every replica's lines until each holds what it should of
    /// `names` (its share among the replicas if `split`, all otherwise) and
    /// each of `reconciled` was reconciled once since `since` (Unix ns);
    /// returns when each one's first such reconcile started.
    async fn c5_steady(
        &self,
        what: &str,
        replicas: &mut [Replica],
        names: &HashSet<String>,
        reconciled: &HashSet<String>,
        split: bool,
        since: i128,
    ) -> HashMap<String, i128> {
        let ids: Vec<String> = replicas.iter().map(|r| r.identity.clone()).collect();
        let want: Vec<usize> = ids
            .iter()
            .map(|id| {
                if split {
                    share(names, &ids, id).len()
                } else {
                    names.len()
                }
            })
            .collect();
        let mut first: HashMap<String, i128> = HashMap::new();
        let deadline = Instant::now() + ALL_TIMEOUT;
        loop {
            for r in replicas.iter_mut() {
                while let Ok(line) = r.run.lines.try_recv() {
                    match line {
                        Line::Held(n) => r.held = n,
                        Line::Start { name, at, .. }
                            if at >= since && reconciled.contains(&name) =>
                        {
                            first.entry(name).or_insert(at);
                        }
                        _ => {}
                    }
                }
            }
            let held: Vec<usize> = replicas.iter().map(|r| r.held).collect();
            if held == want && first.len() == reconciled.len() {
                return first;
            }
            assert!(
                Instant::now() < deadline,
                "C5 {what}: holding {held:?} (want {want:?}), {} of {} reconciled after {ALL_TIMEOUT:?}",
                first.len(),
                reconciled.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Creates `fresh` objects `{prefix}-{i}` one by one, 10 ms apart, and
    /// reports creation to each one's first reconcile (p50 and p99, as the
    /// two `figures`) once every store holds its share of `names` with
    /// them (added to `names` and `created`).
    #[allow(clippy::too_many_arguments)]
    async fn c5_creations(
        &mut self,
        imp: &str,
        what: &str,
        prefix: &str,
        figures: [&'static str; 2],
        replicas: &mut [Replica],
        names: &mut HashSet<String>,
        created: &mut HashSet<String>,
        split: bool,
    ) {
        let fresh = if self.opts.quick { 20 } else { 200 };
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), NS);
        let mut at = HashMap::new();
        for i in 0..fresh {
            let mut cm = ConfigMap::default();
            let new = format!("{prefix}-{i}");
            cm.metadata.name = Some(new.clone());
            at.insert(new.clone(), unix_nanos());
            api.create(&PostParams::default(), &cm)
                .await
                .unwrap_or_else(|e| panic!("C5 create {new}: {e}"));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let these: HashSet<String> = at.keys().cloned().collect();
        names.extend(these.iter().cloned());
        created.extend(these.iter().cloned());
        let since = *at.values().min().unwrap();
        let first = self
            .c5_steady(what, replicas, names, &these, split, since)
            .await;
        let mut lags: Vec<f64> = these
            .iter()
            .map(|k| (first[k] - at[k]) as f64 / 1e6)
            .collect();
        lags.sort_by(f64::total_cmp);
        let pct = |p: f64| lags[((lags.len() - 1) as f64 * p).round() as usize];
        for (p, figure) in [0.5, 0.99].into_iter().zip(figures) {
            self.report.push(imp, WORKLOAD, figure, pct(p));
        }
    }

    /// The identity holding `group`'s coordinator Lease in `ns`.
    async fn coordinator(&self, ns: &str, group: &str) -> Option<String> {
        Api::<Lease>::namespaced(self.client.clone(), ns)
            .get_opt(&format!("{group}.coordinator"))
            .await
            .ok()
            .flatten()?
            .spec?
            .holder_identity
    }

    pub(crate) async fn c5(&mut self) {
        let n = self.c5_n();
        self.seed(NS, n).await;
        self.seed(EMPTY_NS, 0).await;
        let mut names: HashSet<String> = (0..n).map(name).collect();

        // An empty replica with a split cache: the baseline.
        let mut empty = vec![self.start_replica(EMPTY_NS, "c5-empty", 0, true)];
        self.c5_steady(
            "empty",
            &mut empty,
            &HashSet::new(),
            &HashSet::new(),
            true,
            0,
        )
        .await;
        tokio::time::sleep(self.opts.settle()).await;
        let baseline = empty[0].run.rss();
        for r in empty {
            r.run.stop().await;
        }
        let mib = 1048576.0;
        self.report
            .push(OURS, WORKLOAD, "RSS MiB, empty replica", baseline / mib);

        for (count, split) in [(1, false), (3, false), (1, true), (3, true)] {
            let variant = format!(
                "{count} replica{}, {}",
                if count == 1 { "" } else { "s" },
                if split { "split" } else { "whole" }
            );
            let imp = format!("{OURS} ({variant})");
            eprintln!("  C5 {variant}...");
            let group = format!("c5-{count}-{}", if split { "split" } else { "whole" });
            let before = ApiLoad::read(&self.client).await;
            let mut replicas: Vec<Replica> = (0..count)
                .map(|i| self.start_replica(NS, &group, i, split))
                .collect();
            let started = unix_nanos();
            self.c5_steady(&variant, &mut replicas, &names, &names, split, started)
                .await;
            tokio::time::sleep(self.opts.settle()).await;
            let rss: Vec<f64> = replicas.iter().map(|r| r.run.rss()).collect();
            let held: Vec<usize> = replicas.iter().map(|r| r.held).collect();
            let max_rss = rss.iter().copied().fold(0.0, f64::max);
            self.report.push(
                &imp,
                WORKLOAD,
                "objects per replica, most",
                *held.iter().max().unwrap() as f64,
            );
            self.report
                .push(&imp, WORKLOAD, "RSS MiB per replica, most", max_rss / mib);
            self.report.push(
                &imp,
                WORKLOAD,
                "RSS MiB per replica beyond empty, most",
                (max_rss - baseline) / mib,
            );
            if split && count > 1 {
                let coordinator = self.coordinator(NS, &group).await;
                if let Some(c) = replicas
                    .iter()
                    .position(|r| Some(&r.identity) == coordinator.as_ref())
                {
                    // Its own share is about the others': what is left is
                    // the metadata it watches, per object of the kind.
                    let others: Vec<f64> = (0..count).filter(|&i| i != c).map(|i| rss[i]).collect();
                    let mean = others.iter().sum::<f64>() / others.len() as f64;
                    self.report.push(
                        &imp,
                        WORKLOAD,
                        "coordinator bytes per object",
                        (rss[c] - mean) / n as f64,
                    );
                }
            }
            self.say(format!(
                "C5 {variant}: held {held:?}, RSS MiB {:?}",
                rss.iter().map(|b| (b / mib).round()).collect::<Vec<_>>()
            ));

            // New objects, created one by one: creation to first reconcile.
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), NS);
            let mut new_names = HashSet::new();
            self.c5_creations(
                &imp,
                &format!("{variant}, new objects"),
                &format!("new-{group}"),
                [
                    "creation to first reconcile p50 ms",
                    "creation to first reconcile p99 ms",
                ],
                &mut replicas,
                &mut names,
                &mut new_names,
                split,
            )
            .await;

            if split && count == 3 {
                // A replica other than the coordinator restarts: it lists
                // its share in pages, as after any restart, where it got
                // it one label write at a time before.
                let coordinator = self.coordinator(NS, &group).await;
                let i = (0..count)
                    .find(|&i| Some(&replicas[i].identity) != coordinator.as_ref())
                    .expect("a replica that is not the coordinator");
                let old =
                    std::mem::replace(&mut replicas[i], self.start_replica(NS, &group, i, true));
                old.run.stop().await;
                let since = unix_nanos();
                let mut one = vec![replicas.remove(i)];
                let ids: Vec<String> = (0..count).map(|j| format!("r{j}")).collect();
                let own = share(&names, &ids, &one[0].identity);
                self.c5_steady("a restarted replica", &mut one, &own, &own, true, since)
                    .await;
                tokio::time::sleep(self.opts.settle()).await;
                let restarted = one[0].run.rss();
                replicas.insert(i, one.pop().unwrap());
                self.report.push(
                    &imp,
                    WORKLOAD,
                    "RSS MiB beyond empty, a restarted replica",
                    (restarted - baseline) / mib,
                );

                // A fourth replica: the labels that move, counted by the
                // API server.
                let joined = ApiLoad::read(&self.client).await;
                replicas.push(self.start_replica(NS, &group, 3, true));
                let since = unix_nanos();
                // Steady: every store holds its share among four. (Every
                // object was reconciled since by someone: the check asks
                // for reconciles after `since` of objects that did not
                // move too, so it looks only at the shares.)
                let ids: Vec<String> = replicas.iter().map(|r| r.identity.clone()).collect();
                let three = &ids[..3];
                let moved = names
                    .iter()
                    .filter(|k| owner_of(k, three) != owner_of(k, &ids))
                    .count();
                let moving = share(&names, &ids, "r3");
                let mut fourth = replicas.split_off(3);
                self.c5_steady(
                    "the fourth's share",
                    &mut fourth,
                    &moving,
                    &moving,
                    true,
                    since,
                )
                .await;
                replicas.append(&mut fourth);
                tokio::time::sleep(self.opts.settle()).await;
                let load = ApiLoad::read(&self.client).await.since(&joined);
                self.report
                    .push(&imp, WORKLOAD, "objects moving, 3 to 4", moved as f64);
                self.report
                    .push(&imp, WORKLOAD, "label patches, 3 to 4", load.verb("PATCH"));

                // The coordinator crashes (killed, its Leases left to
                // expire): objects created right after wait for the next
                // coordinator, and those the dead replica owned for its
                // member Lease to expire too.
                let coordinator = self.coordinator(NS, &group).await;
                let c = replicas
                    .iter()
                    .position(|r| Some(&r.identity) == coordinator.as_ref())
                    .expect("a coordinator among the four");
                replicas.remove(c).run.kill().await;
                self.c5_creations(
                    &imp,
                    "after the coordinator crashed",
                    &format!("crash-{group}"),
                    [
                        "creation to first reconcile p50 ms, coordinator crashed",
                        "creation to first reconcile p99 ms, coordinator crashed",
                    ],
                    &mut replicas,
                    &mut names,
                    &mut new_names,
                    true,
                )
                .await;
            }

            for r in replicas {
                r.run.stop().await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let load = ApiLoad::read(&self.client).await.since(&before);
            self.report
                .push(&imp, WORKLOAD, "watch events sent", load.watch_events);
            self.report.push(&imp, WORKLOAD, "LISTs", load.verb("LIST"));
            self.report.push(&imp, WORKLOAD, "GETs", load.verb("GET"));
            // The next variant starts from the N objects.
            for k in &new_names {
                let _ = api.delete(k, &DeleteParams::default()).await;
                names.remove(k);
            }
        }
    }
}
