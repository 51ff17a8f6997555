//! One typed config: defaults that run a single node, overridden by a TOML
//! file (`--config`), then `SLUICE_*` environment variables (nested keys with
//! `__`, e.g. `SLUICE_LIMITS__MAX_KEYS`), then command-line flags.
//!
//! Loaded with `figment`, which layers the sources and names the key and the
//! source of every error; policies are validated here too, so a broken edit
//! is refused as a whole with a message naming the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::tls::{ApiTls, PeerTls};

mod bytes;
mod reference;
pub use bytes::{ByteSize, parse_bytes};
pub use reference::{reference, reference_defaults};

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The node's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// A stable name for this node (in Kubernetes, the pod or node name).
    pub node_id: String,
    /// gRPC: the public API, admin API, health and reflection.
    pub grpc_addr: SocketAddr,
    /// The decision APIs on a Unix socket too (`RateLimiter`, Envoy RLS,
    /// health): the node-local path for apps on the same host (a
    /// DaemonSet's pods), skipping the TCP stack. The socket is open to
    /// every user; its directory decides who reaches it. None: off.
    pub grpc_uds: Option<std::path::PathBuf>,
    /// HTTP: `/metrics`, `/healthz`, `/readyz`.
    pub http_addr: SocketAddr,
    /// The admin API's own listener and credential.
    pub admin: AdminConfig,
    /// Log lines as text for a terminal, or one JSON object per line for a
    /// log pipeline. The level comes from `RUST_LOG` (default `info`).
    pub log_format: LogFormat,
    /// Bounds on what the node accepts and keeps.
    pub limits: Limits,
    /// Membership, forwarding, replication and the peer API.
    pub cluster: ClusterConfig,
    /// The Envoy rate limit service front end (RLS v3).
    pub envoy: EnvoyConfig,
    /// TLS for the public gRPC API (optional).
    pub tls: Option<ApiTls>,
    /// Quota headers on HTTP answers (the check endpoint, and Envoy's when
    /// `envoy.response_headers`): any of `retry-after`, `x-ratelimit`, `ietf`.
    pub header_families: Vec<String>,
    /// Named limits, `[policies.NAME]`.
    pub policies: BTreeMap<String, PolicyConfig>,
    /// A test aid: run this node's clock this many milliseconds off the
    /// wall clock (negative: behind), to show that a cluster stays exact
    /// when one node's clock is wrong. Never set it in production.
    pub test_clock_offset_ms: i64,
}

/// Bounds on what the node accepts and keeps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Keys in memory; beyond it, the key closest to fresh is evicted.
    pub max_keys: usize,
    /// Bytes the keys in memory may hold (each key's entry, key, state and
    /// queue slot: a sliding-log key holds up to 16 bytes per logged hit),
    /// an integer or a string like "512MiB"; beyond it, keys are evicted as
    /// at `max_keys`. Unset: half the container's memory limit (cgroup v2
    /// `memory.max`, or v1 `memory.limit_in_bytes`) when one is set, else
    /// 1 GiB. At least 1 MiB.
    pub max_memory: Option<ByteSize>,
    /// Items in one check call: `requests` of a v1 `Check`, `descriptors`
    /// of an Envoy `ShouldRateLimit`.
    pub max_batch: usize,
    /// Bytes in `name` and in `unique_key`, each.
    pub max_key_bytes: usize,
    /// Bytes in one gRPC message, and in one HTTP `/v1/check` body.
    pub max_message_bytes: usize,
    /// The sliding window log's largest limit.
    pub max_log_entries: u64,
    /// How often idle keys are swept, e.g. "10s".
    #[serde(with = "humantime_serde_compat")]
    pub sweep_interval: Duration,
    /// Distinct `name`/`policy` label values in metrics (names come from
    /// clients); the rest are counted under `_other`.
    pub max_metric_names: usize,
    /// Check calls in progress at once on this node, whichever front they
    /// arrive by (v1, Envoy, HTTP: one budget); beyond it a call is answered
    /// at once rather than queued — v1: every item `UNAVAILABLE` /
    /// `OVERLOADED`; Envoy: a gRPC `UNAVAILABLE` error; HTTP: 503.
    pub max_in_flight_checks: usize,
    /// Open connections per listener (public gRPC, admin, peer, HTTP);
    /// beyond it a new connection is closed at once.
    pub max_connections: usize,
    /// A connection (gRPC or HTTP) with no call in progress for this long is closed,
    /// e.g. "5m", and its place in `max_connections` freed: otherwise a
    /// client that connects and goes quiet (or a connection that never
    /// starts a call) holds its place forever. Idle means no call, not no
    /// bytes: HTTP/2 keepalive pings (every quarter of this, at most a
    /// minute, each answered within 20 s at most) flow on idle connections
    /// too, and they are what close a dead peer's connection while a call
    /// is in progress. A client's channel reconnects on its next call.
    #[serde(with = "humantime_serde_compat")]
    pub idle_connection_timeout: Duration,
    /// Concurrent HTTP/2 streams (calls) per connection.
    pub max_concurrent_streams: u32,
    /// Bytes of gRPC messages being received at once, node-wide, all
    /// listeners together (at least `max_message_bytes`): a message is
    /// counted from its first bytes until it is decoded, so concurrent
    /// large calls cannot make the node buffer connections × streams ×
    /// `max_message_bytes` before admission; beyond it a call is refused
    /// with `RESOURCE_EXHAUSTED`.
    pub max_inbound_bytes: usize,
}

/// Who may reset, inspect and list keys (`sluice.v1.Admin`). Apps must
/// not: a reset refills a quota. So the admin API has its own listener,
/// on loopback unless configured otherwise, and every call on it carries
/// the admin token (`authorization: Bearer …`) — or a peer token from the
/// cluster secret, which operators of a cluster hold and apps do not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// The admin gRPC listener (admin API and health).
    pub addr: SocketAddr,
    /// The admin token itself (prefer `token_file`, or `SLUICE_ADMIN__TOKEN`).
    pub token: Option<String>,
    /// Where the admin token is read from; when the file does not exist, a
    /// random token is generated at start and written there (mode 0600),
    /// where `sluice admin` finds it. In Kubernetes, a Secret's file or an
    /// `emptyDir` (the root filesystem is read-only).
    pub token_file: PathBuf,
}

/// The admin token's file when none is configured (relative: beside where
/// the node runs, which is where `sluice admin` looks by default).
pub const DEFAULT_ADMIN_TOKEN_FILE: &str = "sluice-admin.token";

/// An admin token shorter than this is refused: it is the only thing
/// between a reachable admin port and every key's reset.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            addr: "127.0.0.1:8082".parse().expect("valid literal"),
            token: None,
            token_file: PathBuf::from(DEFAULT_ADMIN_TOKEN_FILE),
        }
    }
}

/// Membership and forwarding. With no `seeds`, the node is a healthy
/// one-node cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Nodes with another cluster id ignore each other.
    pub cluster_id: String,
    /// UDP gossip listen address.
    pub gossip_addr: SocketAddr,
    /// The address (IP or host name) peers use to reach this node, for both
    /// gossip and gRPC. Default: the listen address when it is a specific
    /// IP, else 127.0.0.1 (fine for one node; set it — e.g. to the pod IP —
    /// for a real cluster).
    pub advertise_host: Option<String>,
    /// Other nodes' gossip addresses, host:port; DNS names are re-resolved
    /// (in Kubernetes, a headless Service name). With seeds, a node turns
    /// ready only once it reaches a peer: it never decides alone, from
    /// empty counts, because its seeds were down, partitioned away or
    /// spoke another secret (see `bootstrap_expect`).
    pub seeds: Vec<String>,
    /// How a brand-new cluster forms: a node with seeds that sees no ready
    /// peer turns ready once it sees this many nodes (itself included), none
    /// ready, all joining together. A node that sees a ready peer joins it
    /// at once. Default 2: any two nodes that find each other start a
    /// cluster; set it to a majority of the planned fleet so that nodes
    /// restarted all at once on two sides of a partition cannot form two.
    /// 1: a node with seeds that reaches no one starts alone (today's
    /// single-node DaemonSet on a one-node Kubernetes cluster needs it).
    pub bootstrap_expect: usize,
    /// This node's failure domain (a zone, a rack): a key's replica is
    /// kept in another zone than its owner's whenever the ring spans two
    /// or more, so losing a whole zone at once loses no count beyond the
    /// replication lag. It takes effect once every member names one (a
    /// node naming none, or of a release before zones, keeps placement
    /// zone-blind for all). Empty is none: in Kubernetes the DaemonSet
    /// reads the pod's `topology.kubernetes.io/zone` label, which is empty
    /// where the cluster does not copy it from the node (docs/src/survives.md, "Zones").
    pub zone: Option<String>,
    /// The shared secret: gossip datagrams and peer calls carry an HMAC over
    /// it. Prefer `secret_file` (or `SLUICE_CLUSTER__SECRET`) to a literal.
    pub secret: Option<String>,
    /// A file holding the shared secret (surrounding whitespace ignored):
    /// a mounted Kubernetes Secret, say. Read instead of `secret`.
    pub secret_file: Option<PathBuf>,
    /// This run's generation (a restart is a new one). Default: boot time in ms.
    pub generation: Option<u64>,
    /// How often this node gossips with a peer: failure detection and
    /// ring changes take a few of these.
    #[serde(with = "humantime_serde_compat")]
    pub gossip_interval: Duration,
    /// How many mean heartbeat intervals of silence mark a member dead.
    pub phi_threshold: f64,
    /// How long a dead member is remembered in the cluster size `N`.
    #[serde(with = "humantime_serde_compat")]
    pub dead_grace: Duration,
    /// A forward's whole budget, queueing included (Envoy gives a rate-limit
    /// call 20 ms in all).
    #[serde(with = "humantime_serde_compat")]
    pub forward_timeout: Duration,
    /// Items in one forward RPC to a peer (a full batch leaves at once).
    pub batch_max_items: usize,
    /// The longest a forwarded item waits for its batch to fill; a batch
    /// also leaves as soon as no RPC to that peer is outstanding.
    #[serde(with = "humantime_serde_compat")]
    pub batch_wait: Duration,
    /// Items queued per peer before forwards fail fast.
    pub peer_queue: usize,
    /// Forward RPCs in flight per peer.
    pub peer_in_flight: usize,
    /// After announcing `leaving`, keep answering this long before stopping.
    #[serde(with = "humantime_serde_compat")]
    pub leave_grace: Duration,
    /// Consecutive failed calls that open a peer's breaker.
    pub breaker_failures: u32,
    /// How long an open breaker waits before letting one probe through.
    #[serde(with = "humantime_serde_compat")]
    pub breaker_cooldown: Duration,
    /// How often lease consumption is reported to owners.
    #[serde(with = "humantime_serde_compat")]
    pub report_interval: Duration,
    /// Keys an edge remembers owners' answers for (lease seeds), and keys
    /// with unreported lease consumption.
    pub lease_max_keys: usize,
    /// Removed: ownership moves by a transfer that is known to be complete,
    /// not for a time. Accepted (and ignored, with a warning) so an older
    /// config still loads.
    #[serde(skip_serializing)]
    pub ownership_grace: Option<toml::Value>,
    /// How often changed keys are sent to their replica holder (the bound
    /// on replication lag, with the RPC's own time).
    #[serde(with = "humantime_serde_compat")]
    pub replicate_interval: Duration,
    /// How long a leaving node waits for its new owners to take its keys
    /// (and a new owner waits for a silent member before flagging it).
    #[serde(with = "humantime_serde_compat")]
    pub handoff_timeout: Duration,
    /// How long a key whose holders of record are all gone (an owner and
    /// its replica holder lost together) is decided as if its owner were
    /// unreachable, waiting for one of them to come back, before its best
    /// copy is taken (`sluice_keys_taken_from_best_copy`). Longer than
    /// failure detection plus the longest pause a node should survive.
    #[serde(with = "humantime_serde_compat")]
    pub in_doubt_grace: Duration,
    /// Removed (this build speaks protocol 3 and answers protocol 2).
    /// Accepted and ignored, with a warning.
    #[serde(skip_serializing)]
    pub peer_protocol: Option<toml::Value>,
    /// Serve the peer and admin APIs on their own listener (required with
    /// `tls`); peers reach this node there. Default: on `grpc_addr`.
    pub peer_addr: Option<SocketAddr>,
    /// Mutual TLS between peers (and operators) on `peer_addr`.
    pub tls: Option<PeerTls>,
    /// How far a peer token's time may be from this node's clock; a token
    /// is accepted once within it.
    #[serde(with = "humantime_serde_compat")]
    pub token_window: Duration,
    /// Tiered mode: how long an allotment may be spent (its size is the
    /// edge's demand over this long, within its share).
    #[serde(with = "humantime_serde_compat")]
    pub tiered_allotment_ttl: Duration,
    /// Tiered mode inside apps: what this node passes on to sluice-client.
    pub client_allotments: ClientAllotments,
}

/// Sub-grants of this node's tiered allotments to the apps it serves
/// (sluice-client's `Check::tiered`), which then decide those keys in
/// process and report their spending here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientAllotments {
    /// Off: an app's ask is decided as a plain check, with nothing granted.
    pub enabled: bool,
    /// Apps remembered (their report numbers).
    pub max_clients: usize,
    /// Keys one app may hold sub-grants of.
    pub max_keys_per_client: usize,
    /// Apps holding sub-grants of one key.
    pub max_clients_per_key: usize,
    /// How long before the node's own allotment a sub-grant ends, so an
    /// app's report of its last hits is here in time (sluice-client
    /// reports them when its allotment ends, and resends a report not
    /// acknowledged every 50ms). The name is kept for old configs.
    #[serde(with = "humantime_serde_compat")]
    pub report_interval: Duration,
}

impl Default for ClientAllotments {
    fn default() -> Self {
        ClientAllotments {
            enabled: true,
            max_clients: 10_000,
            max_keys_per_client: 10_000,
            max_clients_per_key: 1_024,
            report_interval: Duration::from_millis(50),
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            cluster_id: "sluice".into(),
            gossip_addr: "0.0.0.0:7946".parse().expect("valid literal"),
            advertise_host: None,
            seeds: Vec::new(),
            bootstrap_expect: 2,
            zone: None,
            secret: None,
            secret_file: None,
            generation: None,
            gossip_interval: Duration::from_millis(200),
            phi_threshold: 10.0,
            dead_grace: Duration::from_secs(3_600),
            forward_timeout: Duration::from_millis(10),
            batch_max_items: 256,
            batch_wait: Duration::from_micros(500),
            peer_queue: 10_000,
            peer_in_flight: 16,
            leave_grace: Duration::from_millis(500),
            breaker_failures: 3,
            breaker_cooldown: Duration::from_secs(1),
            report_interval: Duration::from_millis(100),
            lease_max_keys: 100_000,
            ownership_grace: None,
            replicate_interval: Duration::from_millis(20),
            handoff_timeout: Duration::from_secs(5),
            in_doubt_grace: Duration::from_secs(10),
            peer_protocol: None,
            peer_addr: None,
            tls: None,
            token_window: TOKEN_WINDOW,
            tiered_allotment_ttl: Duration::from_millis(250),
            client_allotments: ClientAllotments::default(),
        }
    }
}

impl ClusterConfig {
    /// The secret's bytes, from the literal or the file.
    pub fn secret_bytes(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        if let Some(path) = &self.secret_file {
            let s = std::fs::read(path).map_err(|e| {
                ConfigError(format!(
                    "cluster.secret_file: cannot read {}: {e}",
                    path.display()
                ))
            })?;
            let trimmed = s.trim_ascii().to_vec();
            return Ok((!trimmed.is_empty()).then_some(trimmed));
        }
        Ok(self
            .secret
            .as_ref()
            .filter(|s| !s.is_empty())
            .map(|s| s.as_bytes().to_vec()))
    }
}

/// The Envoy rate limit service front end.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvoyConfig {
    /// envoyproxy/ratelimit descriptor rules: a YAML file, or a directory of
    /// them (a mounted ConfigMap). Reloaded when it changes.
    pub rules_path: Option<PathBuf>,
    /// Add quota headers to Envoy's answers (`response_headers_to_add`).
    pub response_headers: bool,
    /// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG: files naming the same
    /// domain are merged into one (off: a second file for a domain is
    /// refused).
    pub merge_domain_config: bool,
    /// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA: answers carry
    /// `dynamic_metadata` (the request's descriptors and the matched rules'
    /// `metadata`).
    pub response_dynamic_metadata: bool,
}

/// A named limit in the config file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// token_bucket (default), gcra, leaky_bucket, fixed_window,
    /// sliding_window_counter or sliding_window_log.
    pub algorithm: Option<String>,
    /// Requests (or cost units) allowed per `duration` or `window`.
    pub limit: u64,
    /// e.g. "1m", "250ms", "1day". Exactly one of `duration` and `window`.
    pub duration: Option<String>,
    /// A calendar window (fixed_window only): minute, hour, day, week, month, year.
    pub window: Option<String>,
    /// Buckets only (token_bucket, gcra, leaky_bucket): the capacity, how
    /// many may pass at once (default: `limit`).
    pub burst: Option<u64>,
    /// Decide and count, but always allow.
    pub shadow: bool,
    /// When the key's owner cannot be reached: local_share (default), allow or deny.
    pub on_owner_unreachable: Option<String>,
    /// exact (default: every decision by the key's owner) or tiered (hot
    /// keys: each node spends an allotment the owner grants by demand).
    pub mode: Option<String>,
    /// async (default: the owner answers at once, its replica follows) or
    /// sync (the owner answers once its replica holder has the decision; a
    /// crash loses nothing; a peer round trip per decision).
    pub replication: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_id: std::env::var("HOSTNAME").unwrap_or_else(|_| "sluice".to_string()),
            grpc_addr: "0.0.0.0:8081".parse().expect("valid literal"),
            grpc_uds: None,
            http_addr: "0.0.0.0:8080".parse().expect("valid literal"),
            admin: AdminConfig::default(),
            log_format: LogFormat::Text,
            limits: Limits::default(),
            cluster: ClusterConfig::default(),
            envoy: EnvoyConfig::default(),
            tls: None,
            header_families: vec!["retry-after".into(), "x-ratelimit".into(), "ietf".into()],
            policies: BTreeMap::new(),
            test_clock_offset_ms: 0,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_keys: 1_000_000,
            max_memory: None,
            max_batch: 1_000,
            max_key_bytes: 1_024,
            max_message_bytes: 4 * 1024 * 1024,
            max_log_entries: crate::algorithm::DEFAULT_MAX_LOG_ENTRIES,
            sweep_interval: Duration::from_secs(10),
            max_metric_names: 100,
            max_in_flight_checks: 10_000,
            max_connections: 10_000,
            idle_connection_timeout: Duration::from_secs(300),
            max_concurrent_streams: 1_000,
            max_inbound_bytes: 64 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// `max_memory` in bytes, or its default (see the field).
    pub fn max_memory_bytes(&self) -> u64 {
        self.max_memory
            .map_or_else(bytes::default_max_memory, |b| b.0)
    }
}

/// The smallest `limits.max_memory`: below it a single sliding-log key at
/// its bound (10,000 entries, 256 KiB of queue) could not be held twice.
pub const MIN_MAX_MEMORY: u64 = 1 << 20;

/// The most keys a store may be configured for (`limits.max_keys`,
/// `cluster.lease_max_keys`).
pub const MAX_MAX_KEYS: usize = 1_000_000_000;

/// The longest `cluster.forward_timeout`: an edge keeps acknowledged lease
/// spending (`lease::SETTLED_FOR`) for longer than any forward can wait.
pub const MAX_FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest `grpc_uds` path a Unix socket address holds.
pub const MAX_UDS_PATH: usize = 107;

/// The most nodes a brand-new cluster may wait to see before it forms
/// (a fleet larger than this still forms: a majority of it is enough).
pub const MAX_BOOTSTRAP_EXPECT: usize = 1_024;

/// The longest any other interval setting may be (a week: `dead_grace`,
/// an hour by default, is the longest anyone sets).
pub const MAX_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);

/// How far a peer token's timestamp may be from this node's clock, unless
/// configured (`cluster.token_window`).
pub const TOKEN_WINDOW: Duration = Duration::from_secs(10);

/// Where the config comes from, kept so that a reload reads the same layers.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    pub file: Option<PathBuf>,
    /// Command-line overrides as a partial config (only the flags given).
    pub flags: BTreeMap<String, toml::Value>,
}

/// A config that failed to load or validate.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Sources {
    /// Load and validate every layer. (The policies built from it come
    /// from `policy::load`: the config knows nothing of them.)
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = &self.file {
            if !path.exists() {
                return Err(ConfigError(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            fig = fig.merge(Toml::file(path));
        }
        fig = fig
            .merge(Env::prefixed("SLUICE_").split("__"))
            .merge(Serialized::defaults(&self.flags));
        let config: Config = fig.extract().map_err(|e| ConfigError(describe(e)))?;
        config.validate()?;
        Ok(config)
    }

    /// Load a config given as TOML text over the defaults (no environment,
    /// no flags): what a config file alone means.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let config: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(text))
            .extract()
            .map_err(|e| ConfigError(describe(e)))?;
        config.validate()?;
        Ok(config)
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }
}

fn describe(e: figment::Error) -> String {
    e.into_iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// `Duration` as a human string ("10s", "1m") in config files.
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

mod validate;

#[cfg(test)]
mod tests;
