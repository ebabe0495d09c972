//! Pods grouped by node: each node's pods are reconciled one at a time and in
//! order, while nodes are reconciled in parallel.
//!
//! Run it with `cargo run --example pods_by_node`. Keys are "namespace/pod";
//! the partition function looks up the node a pod runs on (a stand-in for an
//! informer cache) and picks that node's partition. A slow node ("node-a",
//! with four pods) does not hold up the others.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_workqueue::Partitioned;

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

#[tokio::main]
async fn main() {
    // Which node each pod is scheduled on, as an informer cache would say.
    let pods: HashMap<&str, &str> = HashMap::from([
        ("default/web-1", "node-a"),
        ("default/web-2", "node-a"),
        ("default/web-3", "node-a"),
        ("default/cache-0", "node-a"),
        ("kube-system/dns-1", "node-b"),
        ("default/db-0", "node-b"),
        ("monitoring/agent-c", "node-c"),
    ]);
    let cache = Arc::new(pods);
    let node_of = {
        let cache = cache.clone();
        move |key: &String| cache.get(key.as_str()).copied().unwrap_or(NODES[0])
    };

    // One partition per node. (With many nodes, hash the node name instead:
    // indexes past the last partition wrap around.)
    let queue = Partitioned::builder(NODES.len(), {
        let node_of = node_of.clone();
        move |key: &String| {
            let node = node_of(key);
            NODES.iter().position(|n| *n == node).unwrap_or(0)
        }
    })
    .name("pods")
    .build()
    .expect("at least one node");

    // Changes as a watch would deliver them; a repeat of a pod that is
    // still queued is merged into one reconcile.
    for pod in [
        "default/web-1",
        "kube-system/dns-1",
        "default/web-2",
        "monitoring/agent-c",
        "default/web-1", // de-duplicated
        "default/db-0",
        "default/web-3",
        "default/cache-0",
    ] {
        queue.add(pod.to_string()).expect("the queue is running");
    }
    println!("ready pods per node {:?}: {:?}", NODES, queue.depths());

    let start = Instant::now();
    let order: Arc<Mutex<BTreeMap<&str, Vec<String>>>> = Arc::default();
    let handle = queue.run({
        let order = order.clone();
        move |item| {
            let (order, node_of) = (order.clone(), node_of.clone());
            async move {
                let pod = item.key().clone();
                let node = node_of(&pod);
                let t = start.elapsed().as_millis();
                println!("{t:>4} ms  {node}  start {pod}");
                // Reconciling takes a while; node-a's pods are slow.
                let work = if node == "node-a" { 40 } else { 25 };
                tokio::time::sleep(Duration::from_millis(work)).await;
                let t = start.elapsed().as_millis();
                println!("{t:>4} ms  {node}  done  {pod}");
                order.lock().unwrap().entry(node).or_default().push(pod);
                item.forget(); // success: no backoff next time
            }
        }
    });

    // web-1 changes while it is being reconciled: it is reconciled again
    // once the run in flight ends, never twice at once.
    tokio::time::sleep(Duration::from_millis(10)).await;
    handle
        .queue()
        .add("default/web-1".to_string())
        .expect("the queue is running");

    // Stop taking new keys, finish every queued pod, and wait for the tasks.
    handle
        .shutdown_with_drain()
        .await
        .expect("partition tasks end normally");

    println!("\nper-node order (the order the pods were added):");
    for (node, pods) in order.lock().unwrap().iter() {
        println!("  {node}: {}", pods.join(" -> "));
    }
}
