//! Whole-config checks run once a config is loaded: what serde's types
//! cannot say (bounds, combinations, files that must exist). Every error
//! names its field.

use std::time::Duration;

use super::*;

/// The longest node id (bytes): a Kubernetes node name, at most 253.
pub const MAX_NODE_ID: usize = 253;

/// The longest zone name (bytes): a Kubernetes label value, at most 63.
pub const MAX_ZONE: usize = 63;

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        let positive = [
            ("limits.max_keys", l.max_keys),
            ("limits.max_batch", l.max_batch),
            ("limits.max_key_bytes", l.max_key_bytes),
            ("limits.max_message_bytes", l.max_message_bytes),
            ("limits.max_in_flight_checks", l.max_in_flight_checks),
            ("limits.max_connections", l.max_connections),
            (
                "limits.max_concurrent_streams",
                l.max_concurrent_streams as usize,
            ),
        ];
        for (key, v) in positive {
            if v == 0 {
                return Err(ConfigError(format!("{key}: must be greater than zero")));
            }
        }
        if l.max_inbound_bytes < l.max_message_bytes {
            return Err(ConfigError(format!(
                "limits.max_inbound_bytes: must be at least limits.max_message_bytes ({}), got {}",
                l.max_message_bytes, l.max_inbound_bytes
            )));
        }
        // The table numbers its slots with u32s (`store/table.rs`), and a
        // billion keys is already ~150 GB.
        for (key, v) in [
            ("limits.max_keys", l.max_keys),
            ("cluster.lease_max_keys", self.cluster.lease_max_keys),
            (
                "cluster.client_allotments.max_clients",
                self.cluster.client_allotments.max_clients,
            ),
            (
                "cluster.client_allotments.max_keys_per_client",
                self.cluster.client_allotments.max_keys_per_client,
            ),
            (
                "cluster.client_allotments.max_clients_per_key",
                self.cluster.client_allotments.max_clients_per_key,
            ),
        ] {
            if v > MAX_MAX_KEYS {
                return Err(ConfigError(format!(
                    "{key}: at most {MAX_MAX_KEYS}, got {v}"
                )));
            }
        }
        if let Some(ByteSize(n)) = l.max_memory
            && n < MIN_MAX_MEMORY
        {
            return Err(ConfigError(format!(
                "limits.max_memory: at least {MIN_MAX_MEMORY} bytes (1MiB), got {n}"
            )));
        }
        if l.sweep_interval.is_zero() {
            return Err(ConfigError(
                "limits.sweep_interval: must be greater than zero".into(),
            ));
        }
        if l.idle_connection_timeout < Duration::from_millis(10) {
            return Err(ConfigError(
                "limits.idle_connection_timeout: at least 10ms".into(),
            ));
        }
        if self.node_id.is_empty() {
            return Err(ConfigError("node_id: must not be empty".into()));
        }
        // Gossip carries the id in every digest entry (a Kubernetes node
        // name is at most 253): one long id must not eat a datagram.
        if self.node_id.len() > MAX_NODE_ID {
            return Err(ConfigError(format!(
                "node_id: at most {MAX_NODE_ID} bytes (got {})",
                self.node_id.len()
            )));
        }
        let c = &self.cluster;
        if c.secret.is_some() && c.secret_file.is_some() {
            return Err(ConfigError(
                "cluster.secret: set secret or secret_file, not both".into(),
            ));
        }
        for (field, set) in [
            ("ownership_grace", c.ownership_grace.is_some()),
            ("peer_protocol", c.peer_protocol.is_some()),
        ] {
            if set {
                tracing::warn!(
                    "cluster.{field} is no longer used (ownership moves by a transfer that is known to be complete; this build speaks peer protocol {}); ignored",
                    crate::proto::PEER_PROTOCOL_VERSION
                );
            }
        }
        // Every interval is multiplied or added to an instant somewhere (the
        // join wait is 10 gossip rounds, a tiered grace 3 report rounds):
        // bounded, none of that can overflow.
        for (key, d) in [
            ("limits.sweep_interval", self.limits.sweep_interval),
            (
                "limits.idle_connection_timeout",
                self.limits.idle_connection_timeout,
            ),
            ("cluster.gossip_interval", c.gossip_interval),
            ("cluster.dead_grace", c.dead_grace),
            ("cluster.batch_wait", c.batch_wait),
            ("cluster.leave_grace", c.leave_grace),
            ("cluster.breaker_cooldown", c.breaker_cooldown),
            ("cluster.report_interval", c.report_interval),
            ("cluster.replicate_interval", c.replicate_interval),
            ("cluster.handoff_timeout", c.handoff_timeout),
            ("cluster.in_doubt_grace", c.in_doubt_grace),
            ("cluster.token_window", c.token_window),
            ("cluster.tiered_allotment_ttl", c.tiered_allotment_ttl),
            (
                "cluster.client_allotments.report_interval",
                c.client_allotments.report_interval,
            ),
        ] {
            if d > MAX_INTERVAL {
                return Err(ConfigError(format!(
                    "{key}: at most {}",
                    humantime::format_duration(MAX_INTERVAL)
                )));
            }
        }
        if let Some(path) = &self.grpc_uds {
            // sun_path holds 108 bytes, the last a NUL.
            let len = path.as_os_str().len();
            if len == 0 || len > MAX_UDS_PATH {
                return Err(ConfigError(format!(
                    "grpc_uds: a socket path of 1 to {MAX_UDS_PATH} bytes (got {len})"
                )));
            }
        }
        // Periods of tasks (a zero interval panics in tokio) and budgets.
        for (key, d) in [
            ("cluster.report_interval", c.report_interval),
            ("cluster.replicate_interval", c.replicate_interval),
            ("cluster.gossip_interval", c.gossip_interval),
            ("cluster.forward_timeout", c.forward_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError(format!("{key}: must be greater than zero")));
            }
        }
        if c.forward_timeout > MAX_FORWARD_TIMEOUT {
            return Err(ConfigError(format!(
                "cluster.forward_timeout: at most {MAX_FORWARD_TIMEOUT:?} (an edge keeps acknowledged lease spending for as long as an answer can be on its way)"
            )));
        }
        if !c.phi_threshold.is_finite() || c.phi_threshold <= 0.0 {
            return Err(ConfigError(
                "cluster.phi_threshold: must be greater than zero".into(),
            ));
        }
        for (key, v) in [
            ("cluster.batch_max_items", c.batch_max_items),
            ("cluster.peer_queue", c.peer_queue),
            ("cluster.peer_in_flight", c.peer_in_flight),
            ("cluster.lease_max_keys", c.lease_max_keys),
            ("cluster.bootstrap_expect", c.bootstrap_expect),
            (
                "cluster.client_allotments.max_clients",
                c.client_allotments.max_clients,
            ),
            (
                "cluster.client_allotments.max_keys_per_client",
                c.client_allotments.max_keys_per_client,
            ),
            (
                "cluster.client_allotments.max_clients_per_key",
                c.client_allotments.max_clients_per_key,
            ),
        ] {
            if v == 0 {
                return Err(ConfigError(format!("{key}: must be greater than zero")));
            }
        }
        if c.bootstrap_expect > MAX_BOOTSTRAP_EXPECT {
            return Err(ConfigError(format!(
                "cluster.bootstrap_expect: at most {MAX_BOOTSTRAP_EXPECT} (the nodes a brand-new cluster waits to see; a majority of the planned fleet is enough)"
            )));
        }
        if let Some(zone) = &c.zone
            && (zone.len() > MAX_ZONE || !zone.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(ConfigError(format!(
                "cluster.zone: at most {MAX_ZONE} printable ASCII characters without spaces (got {zone:?})"
            )));
        }
        let secret = c.secret_bytes()?;
        if !c.seeds.is_empty() && secret.is_none() {
            return Err(ConfigError(
                "cluster.secret: required with cluster.seeds: without it anyone who reaches the gossip port could join the ring, and the peer API (which can reset and spend any key) would answer anyone who reaches it".into(),
            ));
        }
        if let Some(token) = &self.admin.token
            && token.trim().len() < MIN_ADMIN_TOKEN_BYTES
        {
            return Err(ConfigError(format!(
                "admin.token: at least {MIN_ADMIN_TOKEN_BYTES} bytes"
            )));
        }
        if c.tls.is_some() && c.peer_addr.is_none() {
            return Err(ConfigError(
                "cluster.peer_addr: required with cluster.tls (peers and apps do not share a listener)".into(),
            ));
        }
        if c.tiered_allotment_ttl < Duration::from_millis(10) {
            return Err(ConfigError(
                "cluster.tiered_allotment_ttl: at least 10ms".into(),
            ));
        }
        if c.client_allotments.report_interval.is_zero()
            || c.client_allotments.report_interval * 2 >= c.tiered_allotment_ttl
        {
            return Err(ConfigError(format!(
                "cluster.client_allotments.report_interval: greater than zero and under half of cluster.tiered_allotment_ttl ({}) — an app's allotment ends this long before the node's",
                humantime::format_duration(c.tiered_allotment_ttl)
            )));
        }
        if c.token_window < Duration::from_millis(100) {
            return Err(ConfigError("cluster.token_window: at least 100ms".into()));
        }
        if let Some(tls) = &c.tls {
            crate::tls::ServerFiles::peer(tls)
                .load()
                .map_err(|e| ConfigError(e.to_string()))?;
            crate::tls::peer_client(tls).map_err(|e| ConfigError(e.to_string()))?;
        }
        if let Some(tls) = &self.tls {
            crate::tls::ServerFiles::api(tls)
                .load()
                .map_err(|e| ConfigError(e.to_string()))?;
        }
        sluice_api::headers::Families::parse(&self.header_families)
            .map_err(|e| ConfigError(format!("header_families: {e}")))?;
        if let Some(path) = &self.envoy.rules_path
            && !path.exists()
        {
            return Err(ConfigError(format!(
                "envoy.rules_path: {} does not exist",
                path.display()
            )));
        }
        Ok(())
    }
}
