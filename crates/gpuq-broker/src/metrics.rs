//! The broker's OpenMetrics endpoint (`[metrics] listen` in broker.toml;
//! off unless an operator sets it).
//!
//! What an operator watches: the queue, how long jobs wait, how long each
//! step of a DAOS lease takes (preparation and cleanup, histograms), holds,
//! wipes, and requests refused by reason; and each node helper's own step
//! counts and times (`GET /v1/metrics` on the node, fetched at scrape time
//! over the links that are up, labelled `node`).
//!
//! Nothing here names a user, a command or a path: the endpoint is plain
//! TCP without authentication (any local user can read a loopback
//! address), so it carries counts and durations only. Per-user figures are
//! `gpuq stats`, on the broker's socket, root's alone.
//!
//! The endpoint serves `GET /metrics` and nothing else, one scrape at a
//! time, each connection under a deadline: a client that connects and
//! sends nothing, or reads nothing, is dropped, and never delays the queue.

use bytes::Bytes;
use gpuq_protocol::metrics::{NodeMetrics, STEP_BUCKETS};
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Label sets: `(name, value)` pairs.
type Labels = Vec<(&'static str, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;
/// Each node's answer to one scrape (`Err`: why it has none).
pub type NodeAnswers = Vec<(String, Result<NodeMetrics, String>)>;

fn step_histogram() -> Histogram {
    Histogram::new(STEP_BUCKETS)
}

/// Waits range from nothing to days (the queue's `max_time` is 7 days).
fn wait_histogram() -> Histogram {
    Histogram::new([
        1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 259200.0,
        604800.0,
    ])
}

/// The broker's metrics. One per broker; cheap to update from any task.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    queue: Family<Labels, Gauge>,
    lease_held: Gauge,
    wait: Family<Labels, Histogram, fn() -> Histogram>,
    ended: Family<Labels, Counter>,
    daos_step: Histograms,
    daos_phase: Histograms,
    holds: Family<Labels, Counter>,
    wipes: Family<Labels, Counter>,
    refusals: Family<Labels, Counter>,
    /// The nodes' answers of the scrape being encoded (see [`NodeCollector`]).
    nodes: Arc<Mutex<NodeAnswers>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gpuq");
        let queue = Family::<Labels, Gauge>::default();
        registry.register(
            "queue_jobs",
            "Jobs in the queue by state (queued, running)",
            queue.clone(),
        );
        let lease_held = Gauge::default();
        registry.register(
            "lease_held",
            "1 while a DAOS lease is held: no job starts until `gpuq recover`",
            lease_held.clone(),
        );
        let wait: Histograms = Family::new_with_constructor(wait_histogram as fn() -> Histogram);
        registry.register_with_unit(
            "job_wait",
            "Time from submission to start, by kind (gpu, daos)",
            Unit::Seconds,
            wait.clone(),
        );
        let ended = Family::<Labels, Counter>::default();
        registry.register(
            "jobs_ended",
            "Jobs that ended, by final state",
            ended.clone(),
        );
        let daos_step: Histograms =
            Family::new_with_constructor(step_histogram as fn() -> Histogram);
        registry.register_with_unit(
            "daos_step",
            "Each step of a DAOS lease (phase prepare or cleanup), whatever its outcome",
            Unit::Seconds,
            daos_step.clone(),
        );
        let daos_phase: Histograms =
            Family::new_with_constructor(step_histogram as fn() -> Histogram);
        registry.register_with_unit(
            "daos_phase",
            "A DAOS lease's whole preparation (lease to job start) and cleanup (job end to release)",
            Unit::Seconds,
            daos_phase.clone(),
        );
        let holds = Family::<Labels, Counter>::default();
        registry.register(
            "daos_holds",
            "Leases held, by the cleanup step that failed",
            holds.clone(),
        );
        let wipes = Family::<Labels, Counter>::default();
        registry.register(
            "daos_wipes",
            "Wipe steps of DAOS leases (all nodes together), by outcome",
            wipes.clone(),
        );
        let refusals = Family::<Labels, Counter>::default();
        registry.register(
            "refusals",
            "Requests the broker refused, by error code",
            refusals.clone(),
        );
        let nodes = Arc::new(Mutex::new(Vec::new()));
        registry.register_collector(Box::new(NodeCollector {
            nodes: Arc::clone(&nodes),
        }));
        Metrics {
            registry,
            queue,
            lease_held,
            wait,
            ended,
            daos_step,
            daos_phase,
            holds,
            wipes,
            refusals,
            nodes,
        }
    }

    /// A job started after waiting `secs`.
    pub fn started(&self, daos: bool, secs: f64) {
        let kind = if daos { "daos" } else { "gpu" };
        self.wait
            .get_or_create(&labels(&[("kind", kind)]))
            .observe(secs.max(0.0));
    }

    /// A job ended in `state` (`completed`, `failed`, ...).
    pub fn ended(&self, state: &str) {
        self.ended.get_or_create(&labels(&[("state", state)])).inc();
    }

    /// One step of a lease took `secs`; `ok`: it was confirmed. A failed
    /// cleanup step holds the lease; a wipe step is also counted as a wipe.
    pub fn step(&self, phase: &str, step: &str, secs: f64, ok: bool) {
        self.daos_step
            .get_or_create(&labels(&[("phase", phase), ("step", step)]))
            .observe(secs.max(0.0));
        if phase == "cleanup" {
            if !ok {
                self.holds.get_or_create(&labels(&[("step", step)])).inc();
            }
            if step == "wipe" {
                let outcome = if ok { "ok" } else { "failed" };
                self.wipes
                    .get_or_create(&labels(&[("outcome", outcome)]))
                    .inc();
            }
        }
    }

    /// A lease's whole preparation or cleanup took `secs`.
    pub fn phase(&self, phase: &str, secs: f64) {
        self.daos_phase
            .get_or_create(&labels(&[("phase", phase)]))
            .observe(secs.max(0.0));
    }

    /// The broker answered a request with the error `code`.
    pub fn refused(&self, code: &str) {
        self.refusals
            .get_or_create(&labels(&[("code", code)]))
            .inc();
    }

    /// The scrape's text: the gauges set from the broker's state now, the
    /// nodes' answers as given (`None`: no DAOS on this broker).
    pub fn encode(
        &self,
        queued: usize,
        running: usize,
        held: bool,
        nodes: Option<NodeAnswers>,
    ) -> String {
        self.queue
            .get_or_create(&labels(&[("state", "queued")]))
            .set(queued as i64);
        self.queue
            .get_or_create(&labels(&[("state", "running")]))
            .set(running as i64);
        self.lease_held.set(i64::from(held));
        let mut guard = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        *guard = nodes.unwrap_or_default();
        drop(guard);
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would be a
        // bug in a metric, and the scrape then ends early, not the broker.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("encoding metrics: {e}");
        }
        out
    }
}

/// The nodes' metrics, labelled by node, from the answers fetched for the
/// scrape being encoded: `gpuq_node_up`, `gpuq_node_steps_total`,
/// `gpuq_node_step_seconds`, `gpuq_node_refusals_total`.
#[derive(Debug)]
struct NodeCollector {
    nodes: Arc<Mutex<NodeAnswers>>,
}

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        if nodes.is_empty() {
            return Ok(());
        }
        {
            let mut e = encoder.encode_descriptor(
                "node_up",
                "1 if the node helper answered this scrape over its link",
                None,
                MetricType::Gauge,
            )?;
            for (node, r) in nodes.iter() {
                let l = [("node", node.as_str())];
                e.encode_family(&l)?.encode_gauge(&i64::from(r.is_ok()))?;
            }
        }
        let ok: Vec<(&String, &NodeMetrics)> = nodes
            .iter()
            .filter_map(|(n, r)| r.as_ref().ok().map(|m| (n, m)))
            .collect();
        {
            let mut e = encoder.encode_descriptor(
                "node_steps",
                "Lease steps on the node helper since it started, by outcome (ok, refused, failed)",
                None,
                MetricType::Counter,
            )?;
            for (node, m) in &ok {
                for (step, outcomes) in &m.steps {
                    for (outcome, n) in outcomes {
                        let l = [
                            ("node", node.as_str()),
                            ("step", step.as_str()),
                            ("outcome", outcome.as_str()),
                        ];
                        e.encode_family(&l)?
                            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(
                                n, None,
                            )?;
                    }
                }
            }
        }
        {
            let mut e = encoder.encode_descriptor(
                "node_step",
                "How long each lease step took on the node helper",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for (node, m) in &ok {
                for (step, h) in &m.step_seconds {
                    // Buckets from another version are left out, not misread.
                    let Some(buckets) = h.buckets() else { continue };
                    let l = [("node", node.as_str()), ("step", step.as_str())];
                    e.encode_family(&l)?
                        .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                            h.sum, h.count, &buckets, None,
                        )?;
                }
            }
        }
        {
            let mut e = encoder.encode_descriptor(
                "node_refusals",
                "What refused a lease on the node helper, by reason (preflight findings, refused steps)",
                None,
                MetricType::Counter,
            )?;
            for (node, m) in &ok {
                for (reason, n) in &m.refusals {
                    let l = [("node", node.as_str()), ("reason", reason.as_str())];
                    e.encode_family(&l)?
                        .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(
                            n, None,
                        )?;
                }
            }
        }
        Ok(())
    }
}

/// OpenMetrics' content type (what Prometheus asks for first).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// A request head must arrive within this; a whole connection may last
/// at most [`CONNECTION_DEADLINE`].
const HEAD_DEADLINE: Duration = Duration::from_secs(5);
const CONNECTION_DEADLINE: Duration = Duration::from_secs(15);
/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 8;

/// What a scrape answers: the broker's [`crate::broker::Broker::scrape`]
/// (passed in, so that this module needs nothing of the broker's).
pub type Scrape = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>> + Send + Sync,
>;

/// Serve `GET /metrics` on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, scrape: Scrape) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    // One scrape at a time: each asks four nodes.
    let one = Arc::new(tokio::sync::Mutex::new(()));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("metrics accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (b, one) = (Arc::clone(&scrape), Arc::clone(&one));
        tokio::spawn(async move {
            let _permit = permit;
            let svc = hyper::service::service_fn(move |req| {
                let (b, one) = (Arc::clone(&b), Arc::clone(&one));
                async move { Ok::<_, Infallible>(answer(&b, &one, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_DEADLINE)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), svc);
            match tokio::time::timeout(CONNECTION_DEADLINE, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!("metrics connection: {e}"),
                Err(_) => tracing::debug!("metrics connection over its deadline; closed"),
            }
        });
    }
}

async fn answer(
    scrape: &Scrape,
    one: &tokio::sync::Mutex<()>,
    req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ctype: &str, body: String| {
        Response::builder()
            .status(status)
            .header("content-type", ctype)
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
    };
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "gpuq-broker serves only GET /metrics here\n".into(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET /metrics\n".into(),
        );
    }
    let _one = one.lock().await;
    reply(StatusCode::OK, CONTENT_TYPE, scrape().await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> NodeMetrics {
        let mut m = NodeMetrics {
            node: name.into(),
            version: "0.1.0".into(),
            ..NodeMetrics::default()
        };
        m.step("wipe", "ok", 0.3);
        m.step("preflight", "refused", 0.02);
        m.refused("device_refused");
        m
    }

    #[test]
    fn the_text_is_openmetrics_with_every_family_and_the_nodes_labelled() {
        let m = Metrics::new();
        m.started(true, 12.0);
        m.ended("completed");
        m.step("prepare", "format", 1.5, true);
        m.step("cleanup", "wipe", 0.4, true);
        m.step("cleanup", "stop_servers", 9.0, false);
        m.phase("prepare", 20.0);
        m.refused("forbidden");
        let text = m.encode(
            3,
            1,
            true,
            Some(vec![
                ("da1".into(), Ok(node("da1"))),
                ("da2".into(), Err("link not up".into())),
            ]),
        );
        for want in [
            "gpuq_queue_jobs{state=\"queued\"} 3",
            "gpuq_queue_jobs{state=\"running\"} 1",
            "gpuq_lease_held 1",
            "gpuq_job_wait_seconds_count{kind=\"daos\"} 1",
            "gpuq_jobs_ended_total{state=\"completed\"} 1",
            "gpuq_daos_step_seconds_bucket{le=\"2.5\",phase=\"prepare\",step=\"format\"} 1",
            "gpuq_daos_step_seconds_bucket{le=\"1.0\",phase=\"prepare\",step=\"format\"} 0",
            "gpuq_daos_phase_seconds_count{phase=\"prepare\"} 1",
            "gpuq_daos_holds_total{step=\"stop_servers\"} 1",
            "gpuq_daos_wipes_total{outcome=\"ok\"} 1",
            "gpuq_refusals_total{code=\"forbidden\"} 1",
            "gpuq_node_up{node=\"da1\"} 1",
            "gpuq_node_up{node=\"da2\"} 0",
            "gpuq_node_steps_total{node=\"da1\",step=\"wipe\",outcome=\"ok\"} 1",
            "gpuq_node_step_seconds_bucket{le=\"0.5\",node=\"da1\",step=\"wipe\"} 1",
            "gpuq_node_step_seconds_count{node=\"da1\",step=\"wipe\"} 1",
            "gpuq_node_refusals_total{node=\"da1\",reason=\"device_refused\"} 1",
            "# TYPE gpuq_node_step_seconds histogram",
            "# UNIT gpuq_node_step_seconds seconds",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(!text.contains("node=\"da2\",step"), "{text}");
    }

    #[test]
    fn a_node_value_cannot_break_the_text() {
        // A node's step name travels into a label value: quotes and
        // newlines must come out escaped, never as a new line of the text.
        let m = Metrics::new();
        let mut n = node("da1");
        n.step("x\"}\ngpuq_fake 1\n", "ok", 0.1);
        let text = m.encode(0, 0, false, Some(vec![("da1".into(), Ok(n))]));
        assert!(!text.lines().any(|l| l.starts_with("gpuq_fake")), "{text}");
    }

    #[test]
    fn without_daos_there_are_no_node_families() {
        let m = Metrics::new();
        let text = m.encode(0, 0, false, None);
        assert!(!text.contains("gpuq_node_"), "{text}");
        assert!(
            text.contains("gpuq_queue_jobs{state=\"queued\"} 0"),
            "{text}"
        );
    }
}
