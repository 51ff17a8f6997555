//! Operator surfaces over real gRPC and HTTP: admin reset, inspect and top
//! keys; gRPC health; server reflection (v1 and v1alpha); /metrics, /healthz,
//! /readyz and /runbooks.

mod common;

use common::{config, inline, start, under};
use sluice::proto::v1 as pb;
use tokio_stream::StreamExt;

fn key(name: &str, k: &str) -> Option<pb::KeyRef> {
    Some(pb::KeyRef {
        name: name.into(),
        unique_key: k.into(),
    })
}

#[tokio::test]
async fn reset_is_the_admin_way_to_refill_a_key() {
    let n = start(config()).await;
    let mut admin = n.admin().await;
    for _ in 0..3 {
        n.check(inline("api", "alice", 3, 60_000)).await;
    }
    assert!(!under(&n.check(inline("api", "alice", 3, 60_000)).await));
    let before = admin
        .inspect_key(pb::InspectKeyRequest {
            key: key("api", "alice"),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(before.found);
    let s = before.state.unwrap();
    assert_eq!((s.remaining, s.hits, s.refusals, s.reset_gen), (0, 4, 1, 0));
    assert_eq!((s.limit, s.duration_ms, s.burst), (3, 60_000, 3));
    assert_eq!(s.algorithm, pb::Algorithm::TokenBucket as i32);

    let reset = admin
        .reset_key(pb::ResetKeyRequest {
            key: key("api", "alice"),
        })
        .await
        .unwrap();
    assert!(reset.into_inner().existed);
    let after = admin
        .inspect_key(pb::InspectKeyRequest {
            key: key("api", "alice"),
        })
        .await
        .unwrap()
        .into_inner()
        .state
        .unwrap();
    assert_eq!((after.remaining, after.reset_gen), (3, 1));
    assert!(under(&n.check(inline("api", "alice", 3, 60_000)).await));

    let missing = admin
        .reset_key(pb::ResetKeyRequest {
            key: key("api", "nobody"),
        })
        .await
        .unwrap();
    assert!(!missing.into_inner().existed);
    let err = admin
        .reset_key(pb::ResetKeyRequest { key: None })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("key:"));
}

#[tokio::test]
async fn top_keys_by_hits_and_by_refusals() {
    let n = start(config()).await;
    let mut admin = n.admin().await;
    for (k, count, limit) in [("busy", 20, 100), ("blocked", 8, 2), ("quiet", 1, 100)] {
        for _ in 0..count {
            n.check(inline("top", k, limit, 60_000)).await;
        }
    }
    let by_hits = admin
        .top_keys(pb::TopKeysRequest {
            by: pb::TopBy::Hits as i32,
            count: 2,
        })
        .await
        .unwrap()
        .into_inner()
        .keys;
    let names: Vec<_> = by_hits
        .iter()
        .map(|s| s.key.clone().unwrap().unique_key)
        .collect();
    assert_eq!(names, ["busy", "blocked"]);
    let by_refusals = admin
        .top_keys(pb::TopKeysRequest {
            by: pb::TopBy::Refusals as i32,
            count: 10,
        })
        .await
        .unwrap()
        .into_inner()
        .keys;
    assert_eq!(by_refusals.len(), 1);
    assert_eq!(by_refusals[0].refusals, 6);
    let err = admin
        .top_keys(pb::TopKeysRequest {
            by: 0,
            count: 5_000,
        })
        .await
        .unwrap_err();
    assert!(err.message().starts_with("count:"));
}

#[tokio::test]
async fn grpc_health_reports_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let n = start(config()).await;
    let mut health = HealthClient::new(n.channel.clone());
    for service in ["", "sluice.v1.RateLimiter"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
}

#[tokio::test]
async fn reflection_lists_and_describes_the_api() {
    use tonic_reflection::pb::v1::ServerReflectionRequest as V1Request;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient as V1;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest as V1Req;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse as V1Resp;
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest as AlphaRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient as Alpha;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest as AlphaReq;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse as AlphaResp;

    let n = start(config()).await;
    let ask = |m: V1Req| V1Request {
        host: String::new(),
        message_request: Some(m),
    };
    let mut v1 = V1::new(n.channel.clone());
    let requests = tokio_stream::iter(vec![
        ask(V1Req::ListServices(String::new())),
        ask(V1Req::FileContainingSymbol("sluice.v1.RateLimiter".into())),
    ]);
    let mut replies = v1
        .server_reflection_info(requests)
        .await
        .unwrap()
        .into_inner();
    let Some(V1Resp::ListServicesResponse(list)) =
        replies.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    let services: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    for s in [
        "sluice.v1.RateLimiter",
        "sluice.v1.Admin",
        "grpc.health.v1.Health",
    ] {
        assert!(
            services.iter().any(|x| x == s),
            "{s} missing from {services:?}"
        );
    }
    let Some(V1Resp::FileDescriptorResponse(files)) =
        replies.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected file descriptors");
    };
    // The file asked for (the one defining `sluice.v1.RateLimiter`) is
    // there, with the service and its two methods.
    let files: Vec<prost_types::FileDescriptorProto> = files
        .file_descriptor_proto
        .iter()
        .map(|b| prost::Message::decode(&b[..]).expect("a FileDescriptorProto"))
        .collect();
    let file = files
        .iter()
        .find(|f| f.service.iter().any(|s| s.name() == "RateLimiter"))
        .unwrap_or_else(|| {
            panic!(
                "no file defines RateLimiter: {:?}",
                files.iter().map(|f| f.name()).collect::<Vec<_>>()
            )
        });
    assert_eq!(file.package(), "sluice.v1");
    let service = file
        .service
        .iter()
        .find(|s| s.name() == "RateLimiter")
        .unwrap();
    let methods: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
    assert_eq!(methods, ["Check", "CheckStream"]);

    let mut alpha = Alpha::new(n.channel.clone());
    let requests = tokio_stream::iter(vec![AlphaRequest {
        host: String::new(),
        message_request: Some(AlphaReq::ListServices(String::new())),
    }]);
    let mut replies = alpha
        .server_reflection_info(requests)
        .await
        .unwrap()
        .into_inner();
    let Some(AlphaResp::ListServicesResponse(list)) =
        replies.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected a v1alpha service list");
    };
    // The same services as v1 lists.
    let alpha_services: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    for s in [
        "sluice.v1.RateLimiter",
        "sluice.v1.Admin",
        "grpc.health.v1.Health",
    ] {
        assert!(
            alpha_services.iter().any(|x| x == s),
            "{s} missing from {alpha_services:?}"
        );
    }
}

#[tokio::test]
async fn http_admin_endpoints() {
    let n = start(config()).await;
    n.check(inline("metered", "k", 1, 60_000)).await;
    n.check(inline("metered", "k", 1, 60_000)).await;
    assert_eq!(n.http_get("/healthz").await.0, 200);
    assert_eq!(n.http_get("/readyz").await.0, 200);
    let (status, body) = n.http_get("/metrics").await;
    assert_eq!(status, 200);
    for line in [
        "sluice_decisions_total{limit=\"metered\",status=\"under_limit\",reason=\"within_limit\"} 1",
        "sluice_decisions_total{limit=\"metered\",status=\"over_limit\",reason=\"limit_exceeded\"} 1",
        "sluice_keys 1",
        "sluice_check_duration_seconds_count 2",
    ] {
        assert!(body.contains(line), "missing {line:?} in\n{body}");
    }
    assert_eq!(n.http_get("/nope").await.0, 404);
    // The runbooks the alerts link to: the list, one alert's, and an
    // unknown alert named in a 404.
    let (status, body) = n.http_get("/runbooks").await;
    assert_eq!(status, 200);
    assert!(body.contains("\nSluiceNodeDown\n"), "{body}");
    let (status, body) = n.http_get("/runbooks/SluiceKeysInDoubt").await;
    assert_eq!(status, 200);
    assert!(body.starts_with("## SluiceKeysInDoubt\n"), "{body}");
    assert!(body.contains("accept-best-copies"), "{body}");
    assert!(
        !body.contains("## SluiceKeysTakenFromBestCopy"),
        "one section: {body}"
    );
    let (status, body) = n.http_get("/runbooks/SluiceNope").await;
    assert_eq!(status, 404);
    assert!(body.contains("SluiceNope"), "{body}");
}
