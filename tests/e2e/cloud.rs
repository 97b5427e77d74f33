//! The cloud providers (issue 30, parts 3 and 4), over real sockets: Bedrock's SigV4 against
//! botocore's signatures, Vertex AI's service-account token against a token server that checks
//! the JWT with the account's public key, errors and `Retry-After`, `fabric doctor`. The wire
//! parity with LangChain is in wire.rs; the helpers both use are in cloud_support.rs.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fabric::config::{ApiKey, ProviderKind, Tuning};
use fabric::llm::cloud::{AwsKeys, Cloud};
use fabric::llm::providers::{DEFAULT_MAX_REPLY_BYTES, backend_for, shared_client};
use fabric::llm::{LlmError, OutputSpec, ReasonClass};
use serde_json::{Value, json};

use crate::cloud_support::{AWS_KEY_ID, AWS_SECRET, test_account, token_server, wire_target};
use crate::support::{Canned, FakeProvider, fabric_cli, fixtures, reply_json, target};

#[test]
fn our_sigv4_signatures_are_botocores() {
    let file: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("sigv4/botocore.json")).unwrap()).unwrap();
    let vectors = file["vectors"].as_array().unwrap();
    assert!(vectors.len() >= 5);
    for v in vectors {
        let keys = AwsKeys {
            access_key_id: ApiKey::new(v["access_key_id"].as_str().unwrap().into()),
            secret_access_key: ApiKey::new(v["secret_access_key"].as_str().unwrap().into()),
            session_token: v["session_token"].as_str().map(|t| ApiKey::new(t.into())),
        };
        // Bedrock's signing name, or Mantle's (bedrock_mantle_anthropic).
        let service = match v["service"].as_str() {
            Some("bedrock-mantle") => fabric::llm::providers::anthropic_hosted::MANTLE_SERVICE,
            _ => fabric::llm::providers::sigv4::SERVICE,
        };
        let signer = fabric::llm::providers::sigv4::SigV4::for_service(keys, v["region"].as_str().unwrap().into(), service);
        let time: SystemTime = humantime::parse_rfc3339(v["time"].as_str().unwrap()).unwrap();
        let headers = signer.sign(v["url"].as_str().unwrap(), &[("content-type", "application/json")], v["body"].as_str().unwrap().as_bytes(), time).unwrap();
        let get = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str());
        assert_eq!(get("x-amz-date"), v["x-amz-date"].as_str(), "{}", v["url"]);
        assert_eq!(get("authorization"), v["authorization"].as_str(), "{}", v["url"]);
        assert_eq!(get("x-amz-security-token"), v["session_token"].as_str());
    }
}

#[test]
fn our_short_term_bedrock_api_keys_are_the_token_generators() {
    let file: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("sigv4/botocore.json")).unwrap()).unwrap();
    let vectors = file["bedrock_api_keys"].as_array().unwrap();
    assert_eq!(vectors.len(), 2);
    for v in vectors {
        let keys = AwsKeys {
            access_key_id: ApiKey::new(v["access_key_id"].as_str().unwrap().into()),
            secret_access_key: ApiKey::new(v["secret_access_key"].as_str().unwrap().into()),
            session_token: v["session_token"].as_str().map(|t| ApiKey::new(t.into())),
        };
        let signer = fabric::llm::providers::sigv4::SigV4::new(keys, v["region"].as_str().unwrap().into());
        let time: SystemTime = humantime::parse_rfc3339(v["time"].as_str().unwrap()).unwrap();
        let key = signer.bedrock_api_key(time, Duration::from_secs(v["expires"].as_u64().unwrap())).unwrap();
        assert_eq!(key, v["token"].as_str().unwrap(), "{}", v["region"]);
    }
}

#[test]
fn spans_name_each_provider_as_the_otel_registry_does() {
    for key in ["ollama", "openai", "google_genai", "anthropic", "bedrock", "bedrock_converse", "google_vertexai"] {
        let kind = ProviderKind::from_key(key).unwrap();
        assert_eq!(fabric::otel::provider_name(key), kind.otel_name(), "{key}");
    }
    assert_eq!(ProviderKind::BedrockConverse.otel_name(), "aws.bedrock");
    assert_eq!(ProviderKind::VertexAi.otel_name(), "gcp.vertex_ai");
    let named = |key: &str| ProviderKind::from_key(key).unwrap().otel_name();
    assert_eq!(named("anthropic_bedrock"), "aws.bedrock");
    assert_eq!(named("bedrock_mantle_openai"), "aws.bedrock");
    assert_eq!(named("google_anthropic_vertex"), "gcp.vertex_ai");
    assert_eq!(named("ibm"), "ibm.watsonx.ai");
}

/// With the Bedrock API key our request carries what botocore's does: the key as a bearer token,
/// no signature; and over plain HTTP it is refused, as botocore refuses it (loopback excepted).
#[tokio::test]
async fn the_bedrock_api_key_goes_as_botocore_sends_it() {
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("wire/bedrock_converse.json")).unwrap()).unwrap();
    let theirs = &fixture["bearer_request"];
    assert_eq!(theirs["over_http"]["error"], "InvalidEndpointConfigurationError");
    let fake =
        FakeProvider::new(|_| Canned::json(200, json!({"output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}}, "stopReason": "end_turn"})));
    let url = fake.start().await;
    let mut t = target(ProviderKind::BedrockConverse, &url, fixture["model"].as_str().unwrap());
    t.cloud = Some(Cloud::Bedrock { region: "us-east-1".into(), region_var: "AWS_REGION", keys: None });
    let backend = backend_for(shared_client().unwrap(), t, Tuning::default(), DEFAULT_MAX_REPLY_BYTES);
    call(backend.as_ref(), &OutputSpec::Text).await.unwrap();
    let ours = &fake.requests()[0];
    assert_eq!(ours.path, theirs["path"].as_str().unwrap());
    for name in ["authorization", "content-type", "x-amz-date", "x-amz-security-token"] {
        let mine = ours.headers.get(name).map(|v| v.to_str().unwrap().replace("test-key-123", "<api-key>"));
        assert_eq!(mine.as_deref(), theirs["headers"][name].as_str(), "{name}");
    }
    let env = [
        ("FABRIC_LLM_MODEL", "bedrock:amazon.nova-lite-v1:0"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_BEARER_TOKEN_BEDROCK", "k"),
        ("BEDROCK_ENDPOINT_URL", "http://bedrock.internal:8080"),
    ];
    let e = fabric::config::Settings::load(move |k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())).unwrap_err();
    assert_eq!(e.to_string(), "AWS_BEARER_TOKEN_BEDROCK: is sent only over HTTPS, and the Bedrock endpoint `http://bedrock.internal:8080/` is plain HTTP");
}

#[tokio::test]
async fn bedrock_reads_token_usage_cached_prompt_tokens_included() {
    let fake = FakeProvider::new(|body| {
        let mut reply = reply_json(ProviderKind::BedrockConverse, body);
        reply["usage"] = json!({"inputTokens": 31, "outputTokens": 9, "cacheReadInputTokens": 100, "cacheWriteInputTokens": 4, "totalTokens": 144});
        Canned::json(200, reply)
    });
    let url = fake.start().await;
    let backend =
        backend_for(shared_client().unwrap(), wire_target(ProviderKind::BedrockConverse, &url, "m").await, Tuning::default(), DEFAULT_MAX_REPLY_BYTES);
    let reply = call(backend.as_ref(), &structured()).await.unwrap();
    assert_eq!(reply.meta.usage.map(|u| (u.input_tokens, u.output_tokens)), Some((135, 9)));
}

#[tokio::test]
async fn a_slow_token_endpoint_times_out_as_a_timeout() {
    let token = FakeProvider::new(|_| Canned { delay: Duration::from_secs(5), ..Canned::json(200, json!({"access_token": "t", "expires_in": 3599})) });
    let token_uri = format!("{}/token", token.start().await);
    let source = fabric::llm::providers::gcp_token::TokenSource::new(test_account(&token_uri)).with_timeout(Duration::from_millis(200));
    let e = source.token(&shared_client().unwrap()).await.unwrap_err();
    assert_eq!(e.class, ReasonClass::Timeout, "{e:?}");
    assert!(e.message.contains("no answer within 0.2 s") && e.message.contains("token endpoint"), "{}", e.message);
}

async fn call(backend: &dyn fabric::llm::Llm, output: &OutputSpec) -> Result<fabric::llm::LlmReply, LlmError> {
    let events = fabric::events::RunEvents::new("cloud", "cloud", None, Arc::new(fabric::events::NullSink));
    crate::support::complete(backend, &events, "intake", output, None).await
}

fn structured() -> OutputSpec {
    OutputSpec::from_schema(&json!({"type": "object", "properties": {"category": {"type": "string"}, "urgency": {"type": "string"}}, "required": ["category"]}))
}

#[tokio::test]
async fn vertex_sends_the_token_of_a_checked_jwt_and_renews_it_when_it_expires_and_on_a_401() {
    let (token_uri, tokens) = token_server().await;
    let fake = FakeProvider::new(|body| Canned::json(200, reply_json(ProviderKind::VertexAi, body)));
    let url = fake.start().await;
    let mut t = wire_target(ProviderKind::VertexAi, &url, "gemini-2.5-flash").await;
    if let Some(Cloud::Vertex { account, .. }) = &mut t.cloud {
        *account = test_account(&token_uri);
    }
    // A token that lasts one second past the renewal margin.
    *tokens.expires_in.lock().unwrap() = json!(fabric::llm::providers::gcp_token::REFRESH_MARGIN.as_secs() + 1);
    let backend = backend_for(shared_client().unwrap(), t, Tuning::default(), DEFAULT_MAX_REPLY_BYTES);
    let reply = call(backend.as_ref(), &structured()).await.unwrap();
    assert_eq!(reply.meta.usage.map(|u| (u.input_tokens, u.output_tokens)), Some((31, 9)));
    call(backend.as_ref(), &structured()).await.unwrap();
    let auth = |n: usize| fake.requests()[n].headers.get("authorization").unwrap().to_str().unwrap().to_owned();
    assert_eq!((auth(0), auth(1)), ("Bearer token-0".into(), "Bearer token-0".into()), "cached while fresh");
    assert_eq!(
        fake.requests()[0].path,
        "/v1beta1/projects/fabric-test-project/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    call(backend.as_ref(), &structured()).await.unwrap();
    assert_eq!(auth(2), "Bearer token-1", "renewed once it is due");
    // The provider refuses the token: a new one, and the call once more.
    *tokens.expires_in.lock().unwrap() = json!(3599);
    fake.push(Canned::json(401, json!({"error": {"code": 401, "status": "UNAUTHENTICATED", "message": "token-1 expired"}})));
    call(backend.as_ref(), &structured()).await.unwrap();
    assert_eq!((auth(3), auth(4)), ("Bearer token-1".into(), "Bearer token-2".into()));
    let grants = tokens.grants.lock().unwrap().clone();
    assert_eq!(grants, [Ok("token-0".to_owned()), Ok("token-1".into()), Ok("token-2".into())], "every JWT passed the signature check");
    // Refused twice: a client_error, said without any token.
    fake.push(Canned::json(401, json!({"error": {"status": "UNAUTHENTICATED"}})));
    fake.push(Canned::json(401, json!({"error": {"status": "UNAUTHENTICATED"}})));
    let e = call(backend.as_ref(), &structured()).await.unwrap_err();
    assert_eq!(e.class, ReasonClass::ClientError, "{e:?}");
    assert!(!e.message.contains("token-"), "{}", e.message);
}

#[tokio::test]
async fn a_bad_token_endpoint_is_a_clear_error_that_names_it() {
    let fake = FakeProvider::new(|body| Canned::json(200, reply_json(ProviderKind::VertexAi, body)));
    let url = fake.start().await;
    let cases: Vec<(Canned, ReasonClass, &str)> = vec![
        (Canned { status: 200, headers: vec![], body: "<html>not json".into(), delay: Duration::ZERO }, ReasonClass::ProviderError, "not an OAuth token"),
        (Canned::json(200, json!({"access_token": "t", "expires_in": 1e300})), ReasonClass::ServerError, "unused"),
        (Canned::json(400, json!({"error": "invalid_grant", "error_description": "sk-secret"})), ReasonClass::ClientError, "HTTP 400 (invalid_grant)"),
        (Canned::json(503, json!({})), ReasonClass::ServerError, "HTTP 503"),
        (Canned::json(200, json!({"access_token": "x".repeat(100_000)})), ReasonClass::ProviderError, "larger than 65536 bytes"),
        (
            Canned { status: 307, headers: vec![("location", "http://elsewhere.example/token".into())], body: String::new(), delay: Duration::ZERO },
            ReasonClass::ProviderError,
            "HTTP 307",
        ),
    ];
    for (canned, class, says) in cases {
        let token = FakeProvider::new(|_| Canned::json(500, json!({})));
        token.push(canned);
        let token_uri = format!("{}/token", token.start().await);
        let mut t = wire_target(ProviderKind::VertexAi, &url, "gemini-2.5-flash").await;
        if let Some(Cloud::Vertex { account, .. }) = &mut t.cloud {
            *account = test_account(&token_uri);
        }
        let backend = backend_for(shared_client().unwrap(), t, Tuning::default(), DEFAULT_MAX_REPLY_BYTES);
        let result = call(backend.as_ref(), &structured()).await;
        if says == "unused" {
            // A huge expires_in is bounded: the token works and is kept, not an overflow.
            assert!(result.is_ok(), "{result:?}");
            continue;
        }
        let e = result.unwrap_err();
        assert_eq!(e.class, class, "{e:?}");
        assert!(e.message.contains(says) && e.message.contains("token endpoint") && e.message.contains("service-account.json"), "{}", e.message);
        assert!(!e.message.contains("sk-secret") && !e.message.contains("eyJ"), "{}", e.message);
        assert_eq!(token.requests().len(), 1, "no redirect followed");
    }
}

#[tokio::test]
async fn cloud_errors_map_to_reason_classes_and_429_waits_as_told() {
    for kind in [ProviderKind::BedrockConverse, ProviderKind::VertexAi] {
        let fake = FakeProvider::new(|_| Canned::json(500, json!({})));
        let url = fake.start().await;
        let backend = backend_for(shared_client().unwrap(), wire_target(kind, &url, "m:1").await, Tuning::default(), DEFAULT_MAX_REPLY_BYTES);
        let bedrock = |code: &str| vec![("x-amzn-errortype", format!("{code}:http://internal.amazon.com/coral/com.amazon.bedrock/"))];
        let cases = [
            (429, "ThrottlingException", "RESOURCE_EXHAUSTED", ReasonClass::RateLimited),
            (400, "ValidationException", "INVALID_ARGUMENT", ReasonClass::ClientError),
            (403, "AccessDeniedException", "PERMISSION_DENIED", ReasonClass::ClientError),
            (500, "InternalServerException", "INTERNAL", ReasonClass::ServerError),
            (503, "ServiceUnavailableException", "UNAVAILABLE", ReasonClass::ServerError),
        ];
        for (status, aws, google, class) in cases {
            let mut canned = if kind == ProviderKind::VertexAi {
                Canned::json(status, json!({"error": {"code": status, "message": "m", "status": google}}))
            } else {
                Canned { headers: bedrock(aws), ..Canned::json(status, json!({"message": "Too many requests"})) }
            };
            canned.headers.push(("retry-after", "7".into()));
            fake.push(canned);
            let e = call(backend.as_ref(), &structured()).await.unwrap_err();
            assert_eq!(e.class, class, "{kind:?} {status}");
            let code = if kind == ProviderKind::VertexAi { google } else { aws };
            assert!(e.message.contains(&format!("HTTP {status} from {} ({code})", kind.key())), "{}", e.message);
            assert_eq!(e.class.is_retryable(), matches!(status, 429 | 500 | 503));
            if status == 429 {
                assert_eq!(e.retry_after.map(|w| w.after), Some(Duration::from_secs(7)), "{kind:?}");
            }
        }
        // A redirect to another origin is not followed: the signature or token goes nowhere else.
        let before = fake.requests().len();
        fake.push(Canned { headers: vec![("location", "https://elsewhere.example/steal".into())], ..Canned::json(307, json!({})) });
        let e = call(backend.as_ref(), &structured()).await.unwrap_err();
        assert_eq!(e.class, ReasonClass::ProviderError, "{kind:?}");
        assert!(e.message.contains("never follow redirects"), "{}", e.message);
        assert_eq!(fake.requests().len(), before + 1, "{kind:?}");
    }
}

#[tokio::test]
async fn bedrock_signs_with_keys_or_sends_the_api_key_and_doctor_says_where_they_came_from() {
    // The probe asks for `{"ok": true}` through the forced tool.
    let fake = FakeProvider::new(|body| {
        let name = body.pointer("/toolConfig/toolChoice/tool/name").cloned().unwrap_or(json!("x"));
        Canned::json(
            200,
            json!({"output": {"message": {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t", "name": name, "input": {"ok": true}}}]}}, "stopReason": "tool_use"}),
        )
    });
    let url = fake.start().await;
    let base = vec![("FABRIC_LLM_MODEL", "bedrock_converse:anthropic.claude-3-5-haiku-20241022-v1:0".to_owned()), ("BEDROCK_ENDPOINT_URL", url.clone())];
    let keys = [
        ("AWS_REGION", "eu-west-3".to_owned()),
        ("AWS_ACCESS_KEY_ID", AWS_KEY_ID.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", AWS_SECRET.to_owned()),
        ("AWS_SESSION_TOKEN", "session-secret".to_owned()),
    ];
    let env: Vec<_> = base.iter().cloned().chain(keys.iter().cloned()).collect();
    let out = fabric_cli(&["doctor", "--probe"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("provider: bedrock_converse  model: anthropic.claude-3-5-haiku-20241022-v1:0"), "{stdout}");
    assert!(stdout.contains("region: eu-west-3 (from AWS_REGION)"), "{stdout}");
    assert!(stdout.contains("credentials: AWS Signature Version 4 with keys from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN"), "{stdout}");
    assert!(stdout.contains("probe: ok in "), "{stdout}");
    for secret in [AWS_KEY_ID, AWS_SECRET, "session-secret"] {
        assert!(!stdout.contains(secret) && !String::from_utf8_lossy(&out.stderr).contains(secret), "{secret} shown: {stdout}");
    }
    let r = &fake.requests()[0];
    assert_eq!(r.path, "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse");
    let auth = r.headers.get("authorization").unwrap().to_str().unwrap();
    assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/") && auth.contains("/eu-west-3/bedrock/aws4_request"), "{auth}");
    assert_eq!(r.headers.get("x-amz-security-token").unwrap(), "session-secret");
    // The Bedrock API key instead: a bearer token, no signature.
    let env: Vec<_> = base
        .iter()
        .cloned()
        .chain([("AWS_DEFAULT_REGION", "us-east-1".to_owned()), ("AWS_BEARER_TOKEN_BEDROCK", "bedrock-api-key-secret".to_owned())])
        .collect();
    let out = fabric_cli(&["doctor", "--probe"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("credentials: Bedrock API key (bearer) from AWS_BEARER_TOKEN_BEDROCK") && !stdout.contains("bedrock-api-key-secret"), "{stdout}");
    assert!(stdout.contains("AWS_BEARER_TOKEN_BEDROCK=<redacted>"), "{stdout}");
    assert_eq!(fake.requests()[1].headers.get("authorization").unwrap(), "Bearer bedrock-api-key-secret");
    // Missing pieces are named.
    let out = fabric_cli(&["doctor"], &base).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration: ERROR AWS_REGION or AWS_DEFAULT_REGION: is required for provider bedrock_converse"));
    let env: Vec<_> = base.iter().cloned().chain([("AWS_REGION", "us-east-1".to_owned()), ("AWS_ACCESS_KEY_ID", AWS_KEY_ID.to_owned())]).collect();
    let out = fabric_cli(&["doctor"], &env).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration: ERROR AWS_SECRET_ACCESS_KEY: is required with AWS_ACCESS_KEY_ID"));
}

#[tokio::test]
async fn vertex_doctor_shows_project_location_and_account_and_probes() {
    let (token_uri, tokens) = token_server().await;
    let fake = FakeProvider::new(|body| {
        let name = body.pointer("/toolConfig/functionCallingConfig/allowedFunctionNames/0").cloned().unwrap_or(json!("x"));
        Canned::json(
            200,
            json!({"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": name, "args": {"ok": true}}}]}, "finishReason": "STOP"}]}),
        )
    });
    let url = fake.start().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("sa.json");
    let mut file: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("vertex/service-account.json")).unwrap()).unwrap();
    file["token_uri"] = json!(token_uri);
    std::fs::write(&key_file, file.to_string()).unwrap();
    let env = vec![
        ("FABRIC_LLM_MODEL", "google_vertexai:gemini-2.5-flash".to_owned()),
        ("GOOGLE_VERTEX_BASE_URL", url),
        ("GOOGLE_APPLICATION_CREDENTIALS", key_file.to_str().unwrap().to_owned()),
        ("CLOUD_ML_REGION", "europe-west4".to_owned()),
    ];
    let out = fabric_cli(&["doctor", "--probe"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("project: fabric-test-project (from project_id of ") && stdout.contains("location: europe-west4 (CLOUD_ML_REGION)"), "{stdout}");
    assert!(
        stdout.contains("credentials: service account fabric-test@fabric-test-project.iam.gserviceaccount.com from GOOGLE_APPLICATION_CREDENTIALS="),
        "{stdout}"
    );
    assert!(stdout.contains("probe: ok in "), "{stdout}");
    assert!(!stdout.contains("PRIVATE KEY") && !stdout.contains("token-0"), "{stdout}");
    assert_eq!(
        fake.requests()[0].path,
        "/v1beta1/projects/fabric-test-project/locations/europe-west4/publishers/google/models/gemini-2.5-flash:generateContent"
    );
    assert_eq!(tokens.grants.lock().unwrap().clone(), [Ok("token-0".to_owned())]);
    // A malformed key file is named, its content never quoted.
    std::fs::write(&key_file, r#"{"type": "service_account", "client_email": "a@b", "private_key": "-----BEGIN PRIVATE KEY-----\nsk-secret"#).unwrap();
    let out = fabric_cli(&["doctor"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("configuration: ERROR GOOGLE_APPLICATION_CREDENTIALS: `") && stdout.contains("is not a service-account key file (JSON, line"),
        "{stdout}"
    );
    assert!(!stdout.contains("sk-secret"), "{stdout}");
}
