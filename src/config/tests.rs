//! The config loader's tests.
use super::*;

fn write(dir: &Path, body: &str) -> PathBuf {
    let p = dir.join("sluice.toml");
    std::fs::write(&p, body).unwrap();
    p
}

fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "sluice-config-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn defaults_run_a_single_node() {
    let c = Sources::default().load().unwrap();
    assert_eq!(c.grpc_addr.port(), 8081);
    assert_eq!(c.limits.max_batch, 1_000);
    assert_eq!(c.limits.idle_connection_timeout, Duration::from_secs(300));
    assert!(c.policies.is_empty());
}

#[test]
fn file_then_flags_override() {
    let dir = tempdir();
    let file = write(
        &dir,
        "grpc_addr = \"127.0.0.1:9000\"\n[limits]\nmax_keys = 5\n[policies.api]\nlimit = 10\nduration = \"1m\"\n",
    );
    let mut flags = BTreeMap::new();
    flags.insert(
        "grpc_addr".to_string(),
        toml::Value::String("127.0.0.1:9001".into()),
    );
    let c = Sources {
        file: Some(file),
        flags,
    }
    .load()
    .unwrap();
    assert_eq!(c.grpc_addr.port(), 9001);
    assert_eq!(c.limits.max_keys, 5);
    assert_eq!(c.policies["api"].limit, 10);
}

#[test]
fn max_memory_takes_bytes_or_a_size_with_a_unit() {
    let c = Sources::from_toml_str("[limits]\nmax_memory = \"512MiB\"\n").unwrap();
    assert_eq!(c.limits.max_memory, Some(ByteSize(512 << 20)));
    assert_eq!(c.limits.max_memory_bytes(), 512 << 20);
    let c = Sources::from_toml_str("[limits]\nmax_memory = 2097152\n").unwrap();
    assert_eq!(c.limits.max_memory_bytes(), 2 << 20);
    let unset = Sources::from_toml_str("").unwrap();
    assert_eq!(unset.limits.max_memory, None);
    assert!(unset.limits.max_memory_bytes() >= MIN_MAX_MEMORY);
    for bad in [
        "max_memory = \"lots\"",
        "max_memory = \"1.5GiB\"",
        "max_memory = -1",
        "max_memory = 1000",
        "max_memory = \"12 parsecs\"",
    ] {
        let err = Sources::from_toml_str(&format!("[limits]\n{bad}\n")).unwrap_err();
        assert!(err.0.contains("limits.max_memory"), "{bad}: {err}");
    }
}

#[test]
fn errors_name_the_key() {
    let dir = tempdir();
    let cases = [
        ("[limits]\nmax_keys = \"many\"\n", "max_keys"),
        ("[limits]\nmax_batch = 0\n", "limits.max_batch"),
        (
            "[limits]\nmax_keys = 4294967296\n",
            "limits.max_keys: at most 1000000000",
        ),
        (
            "[cluster]\nlease_max_keys = 2000000000\n",
            "cluster.lease_max_keys: at most",
        ),
        (
            "[limits]\nidle_connection_timeout = \"0s\"\n",
            "limits.idle_connection_timeout",
        ),
        (
            "[limits]\nidle_connection_timeout = \"soon\"\n",
            "idle_connection_timeout",
        ),
        ("unknown_thing = 1\n", "unknown_thing"),
        (
            "[cluster]\nforward_timeout = \"11s\"\n",
            "cluster.forward_timeout: at most 10s",
        ),
        // Durations that would overflow where they are multiplied (the
        // join wait, a tiered grace) are refused, never a panic.
        (
            "[cluster]\ngossip_interval = \"100000000years\"\n",
            "cluster.gossip_interval: at most 7days",
        ),
        (
            "[cluster]\nreport_interval = \"8days\"\n",
            "cluster.report_interval: at most 7days",
        ),
        (
            "[cluster]\ntiered_allotment_ttl = \"500000000000years\"\n",
            "cluster.tiered_allotment_ttl: at most 7days",
        ),
        (
            "[cluster.client_allotments]\nreport_interval = \"500000000000years\"\n",
            "cluster.client_allotments.report_interval: at most 7days",
        ),
        (
            "[cluster.client_allotments]\nreport_interval = \"200ms\"\n",
            "cluster.client_allotments.report_interval: greater than zero and under half",
        ),
        (
            "[cluster.client_allotments]\nmax_keys_per_client = 0\n",
            "cluster.client_allotments.max_keys_per_client: must be greater than zero",
        ),
        (
            "[cluster.client_allotments]\nmax_clients = 2000000000\n",
            "cluster.client_allotments.max_clients: at most",
        ),
        (
            &*format!("node_id = \"{}\"\n", "n".repeat(254)),
            "node_id: at most 253 bytes (got 254)",
        ),
        (
            "[cluster]\nzone = \"eu west\"\n",
            "cluster.zone: at most 63 printable ASCII characters without spaces (got \"eu west\")",
        ),
        (
            &*format!("[cluster]\nzone = \"{}\"\n", "z".repeat(64)),
            "cluster.zone: at most 63",
        ),
        (
            "[cluster]\ndead_grace = \"30days\"\n",
            "cluster.dead_grace: at most 7days",
        ),
        // Intervals of a periodic task: zero would panic in the task.
        (
            "[cluster]\nreport_interval = \"0s\"\n",
            "cluster.report_interval: must be greater than zero",
        ),
        (
            "[limits]\nsweep_interval = \"0s\"\n",
            "limits.sweep_interval: must be greater than zero",
        ),
        // A budget of message bytes that no whole message fits.
        (
            "[limits]\nmax_message_bytes = 1000\nmax_inbound_bytes = 999\n",
            "limits.max_inbound_bytes: must be at least limits.max_message_bytes (1000)",
        ),
    ];
    for (body, key) in cases {
        let file = write(&dir, body);
        let err = Sources {
            file: Some(file),
            ..Default::default()
        }
        .load()
        .unwrap_err();
        assert!(err.0.contains(key), "{body:?}: {err}");
    }
}
