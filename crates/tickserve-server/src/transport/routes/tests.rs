#![allow(clippy::unwrap_used)]

use super::*;
use EndpointGroup as G;

fn model(name: &str, version: Option<&str>, endpoint: ModelEndpoint) -> HttpRoute {
    HttpRoute::Model(
        ModelRef {
            model: name.into(),
            version: version.map(str::to_string),
        },
        endpoint,
    )
}

#[test]
fn a_segment_is_percent_decoded_byte_by_byte_and_a_bad_escape_is_refused() {
    assert!(matches!(decode("plain"), Some(Cow::Borrowed("plain"))));
    for (segment, want) in [
        ("%6D", "m"),
        ("a%2Fb", "a/b"),
        ("x%41y%42", "xAyB"),
        ("%25%25", "%%"),
        ("%C3%A9t%C3%A9", "été"),
    ] {
        assert_eq!(decode(segment).as_deref(), Some(want), "{segment}");
    }
    for bad in ["%4", "a%", "%zz", "%FF", "x%C3"] {
        assert_eq!(decode(bad), None, "{bad}");
    }
}

#[test]
fn every_served_path_has_its_route_and_group() {
    use ModelEndpoint as E;
    for (path, route, group) in [
        ("/v2/health/live", HttpRoute::Live, G::Health),
        ("/v2/health/ready", HttpRoute::Ready, G::Health),
        ("/v2/models/m/ready", model("m", None, E::Ready), G::Health),
        (
            "/v2/models/m/versions/2/ready",
            model("m", Some("2"), E::Ready),
            G::Health,
        ),
        ("/v2", HttpRoute::ServerMetadata, G::Metadata),
        ("/v2/models/m", model("m", None, E::Metadata), G::Metadata),
        (
            "/v2/models/m/versions/2",
            model("m", Some("2"), E::Metadata),
            G::Metadata,
        ),
        (
            "/v2/models/m/infer",
            model("m", None, E::Infer),
            G::Inference,
        ),
        (
            "/v2/models/m/versions/2/infer",
            model("m", Some("2"), E::Infer),
            G::Inference,
        ),
        (
            "/v2/models/m/config",
            model("m", None, E::Config),
            G::ModelConfig,
        ),
        (
            "/v2/models/m/versions/2/config",
            model("m", Some("2"), E::Config),
            G::ModelConfig,
        ),
        (
            "/v2/models/m/stats",
            model("m", None, E::Stats),
            G::Statistics,
        ),
        (
            "/v2/models/m/versions/2/stats",
            model("m", Some("2"), E::Stats),
            G::Statistics,
        ),
        ("/v2/models/stats", HttpRoute::AllStats, G::Statistics),
        (
            "/v2/repository/index",
            HttpRoute::RepositoryIndex,
            G::ModelRepository,
        ),
        (
            "/v2/repository/models/m/load",
            HttpRoute::RepositoryLoad("m".into()),
            G::ModelRepository,
        ),
        (
            "/v2/repository/models/m/unload",
            HttpRoute::RepositoryUnload("m".into()),
            G::ModelRepository,
        ),
        (
            "/v2/models/m/sequences",
            model("m", None, E::Sequences),
            G::ModelRepository,
        ),
        (
            "/v2/models/m/sequences/read",
            model("m", None, E::SequenceRead),
            G::ModelRepository,
        ),
        (
            "/v2/models/m/versions/2/sequences/write",
            model("m", Some("2"), E::SequenceWrite),
            G::ModelRepository,
        ),
        (
            "/v2/models/m/sequences/drop",
            model("m", None, E::SequenceDrop),
            G::ModelRepository,
        ),
        ("/metrics", HttpRoute::Metrics, G::Metrics),
    ] {
        assert_eq!(HttpRoute::parse(path).as_ref(), Some(&route), "{path}");
        assert_eq!(route.group(), group, "{path}");
    }
    for (path, group) in [
        ("/v1/models/m:predict", G::Inference),
        ("/v1/models/m/versions/3:predict", G::Inference),
        ("/v1/models/m/metadata", G::Metadata),
        ("/v1/models/m", G::Health),
        ("/v1/models/m/versions/3", G::Health),
        ("/v1/models/m/bogus/path", G::Inference),
        ("/v1/models/m/versions/HELLO:predict", G::Inference),
    ] {
        assert_eq!(HttpRoute::parse(path).unwrap().group(), group, "{path}");
    }
}

#[test]
fn paths_that_do_not_parse_have_no_route() {
    for path in [
        "/v2/models/m/sequences/other",
        "/v2/models/m/bogus",
        "/v2/models/m/versions/2/infer/more",
        "/elsewhere",
        "/v2/",
        "/v2//health/live",
        "/v2/health/live/",
        "/v2/models/m/infer/",
        "/v2/models/%zz/infer",
        "/v2/models/%ff/infer",
        "/v2/models/m/infer%",
        "/v1/models/",
        "/v1/models",
        "",
        "v2",
    ] {
        assert_eq!(HttpRoute::parse(path), None, "{path}");
    }
}

/// An encoded spelling parses to the same route as the plain one, so the
/// key check sees what the handler serves.
#[test]
fn encoded_spellings_parse_to_the_plain_route() {
    for (encoded, plain) in [
        (
            "/v1/models/m/versions/%31:predict",
            "/v1/models/m/versions/1:predict",
        ),
        ("/v1/models/m%3Apredict", "/v1/models/m:predict"),
        ("/v1/models/m%3apredict", "/v1/models/m:predict"),
        ("/v1/models/m/%6Detadata", "/v1/models/m/metadata"),
        ("/v1/models/m/versions/%32", "/v1/models/m/versions/2"),
        ("/v2/models/m/%69nfer", "/v2/models/m/infer"),
        (
            "/v2/models/%6D/versions/%31/infer",
            "/v2/models/m/versions/1/infer",
        ),
        ("/v2/%6Dodels/m/config", "/v2/models/m/config"),
        ("/%6Detrics", "/metrics"),
        (
            "/v2/repository/models/m/%6Coad",
            "/v2/repository/models/m/load",
        ),
        (
            "/v2/models/m/sequences/%77rite",
            "/v2/models/m/sequences/write",
        ),
    ] {
        let route = HttpRoute::parse(encoded);
        assert!(route.is_some(), "{encoded}");
        assert_eq!(route, HttpRoute::parse(plain), "{encoded}");
    }
    // An encoded slash is part of a name, never a separator.
    assert_eq!(
        HttpRoute::parse("/v2/models/a%2Fb/infer"),
        Some(model("a/b", None, ModelEndpoint::Infer))
    );
    assert_eq!(
        HttpRoute::parse("/v2/models/m%2Finfer"),
        Some(model("m/infer", None, ModelEndpoint::Metadata))
    );
}

#[test]
fn tf_paths_parse_as_tf_serving_reads_them() {
    let t = parse_tf("half_plus_two:predict").unwrap();
    assert_eq!(
        (t.model.as_str(), t.verb.as_deref(), t.version, t.metadata),
        ("half_plus_two", Some("predict"), None, false)
    );
    let t = parse_tf("m/versions/123:predict").unwrap();
    assert_eq!(t.version.as_deref(), Some("123"));
    let t = parse_tf("m/versions/7/metadata").unwrap();
    assert!(t.metadata && t.verb.is_none());
    let t = parse_tf("m/labels/stable").unwrap();
    assert_eq!(t.label.as_deref(), Some("stable"));
    assert_eq!(t.asked(), Some("stable"), "a label is the version asked");
    assert!(
        parse_tf("m/versions/0:predict").is_ok(),
        "version 0 is a number"
    );
    assert!(
        parse_tf("m/versions/-1:predict").is_err(),
        "a negative version is not"
    );
    assert_eq!(parse_tf("m/versions/3:predict").unwrap().asked(), Some("3"));
    assert_eq!(parse_tf("m:predict").unwrap().asked(), None);
    assert!(
        parse_tf("m/version/50:predict")
            .unwrap_err()
            .contains("malformed")
    );
    assert!(
        parse_tf("m/versions/HELLO:regress")
            .unwrap_err()
            .contains("failed to convert")
    );
    assert!(
        parse_tf("m/versions/18446744073709551615:predict")
            .unwrap_err()
            .contains("failed to convert")
    );
    assert!(parse_tf(":predict").is_err());
    assert!(parse_tf("m:predict/metadata").is_err());
}

#[test]
fn every_grpc_method_has_its_group() {
    for (path, group) in grpc_methods() {
        assert_eq!(grpc_group(path), Some(group), "{path}");
    }
    assert_eq!(
        grpc_group("/inference.GRPCInferenceService/ModelConfig"),
        Some(G::ModelConfig)
    );
    for path in [
        "/inference.GRPCInferenceService/Other",
        "/inference.GRPCInferenceService/",
        "/grpc.health.v1.Health/Other",
        "/tickserve.SequenceService/Other",
        "/inference.GRPCInferenceService/Model%49nfer",
        "",
    ] {
        assert_eq!(grpc_group(path), None, "{path}");
    }
}
