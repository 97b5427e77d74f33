//! The last of `init_chat_model`'s keys through the `fabric` CLI (issue #30): Hugging Face's
//! router, Bedrock's Mantle endpoint (OpenAI and Anthropic), Meta's Model API, the LangSmith
//! gateway, Claude on Bedrock's InvokeModel and on Vertex AI. Each resolves from its package's
//! own variables, `fabric doctor` shows where its endpoint and credentials came from (never
//! them), `--probe` reaches it and `fabric run` completes support-triage against a fake. (Their
//! requests and readings against LangChain's packages are in `wire.rs`.)

use fabric::config::ProviderKind;
use serde_json::{Value, json};

use crate::cloud_support::{AWS_KEY_ID, AWS_SECRET, token_server};
use crate::support::{Canned, FakeProvider, fabric_cli, fixtures, reply_json, triage_reply_for};

const SECRET: &str = "sk-hosted-secret-0001";
const GOAL: &str = r#"{"ticket":"I was charged twice"}"#;

/// Where a request of `kind` carries its schema.
fn schema_of(kind: ProviderKind, body: &Value) -> Option<&Value> {
    match kind {
        ProviderKind::HostedAnthropic(_) => body.pointer("/tools/0/input_schema"),
        _ => crate::support::compat_schema(body),
    }
}

/// A fake of `kind` answering the probe's `{"ok": true}` and support-triage's stages.
fn fake(kind: ProviderKind) -> FakeProvider {
    FakeProvider::new(move |body| {
        let props: Vec<String> =
            schema_of(kind, body).and_then(|s| s.get("properties")).and_then(Value::as_object).map_or_else(Vec::new, |p| p.keys().cloned().collect());
        let answer = if props.iter().any(|p| p == "ok") { json!({"ok": true}) } else { triage_reply_for(&props) };
        let reply = match kind {
            ProviderKind::HostedAnthropic(_) if body.get("tools").is_some() => {
                let name = body.pointer("/tool_choice/name").cloned().unwrap_or(json!("x"));
                json!({"content": [{"type": "tool_use", "id": "t", "name": name, "input": answer}], "stop_reason": "tool_use", "usage": {"input_tokens": 31, "output_tokens": 9}})
            }
            ProviderKind::HostedAnthropic(_) => json!({"content": [{"type": "text", "text": "Refunded."}], "stop_reason": "end_turn"}),
            _ if props.is_empty() => reply_json(kind, body),
            _ => crate::support::compat_reply(body, &answer),
        };
        Canned::json(200, reply)
    })
}

/// One key: its model, its environment at the fake's `url`, what doctor says of its
/// credentials, and the path its calls take.
struct Case {
    key: &'static str,
    model: &'static str,
    env: Vec<(&'static str, String)>,
    credentials: String,
    path: String,
}

async fn cases(url: &str, key_file: &str) -> Vec<Case> {
    let aws = |extra: Vec<(&'static str, String)>| {
        let mut env = vec![("AWS_REGION", "us-east-1".to_owned())];
        env.extend(extra);
        env
    };
    vec![
        Case {
            key: "huggingface",
            model: "meta-llama/Llama-3.3-70B-Instruct",
            env: vec![("FABRIC_LLM_BASE_URL", url.to_owned()), ("HF_TOKEN", SECRET.to_owned())],
            credentials: "api key: set (from HF_TOKEN)".into(),
            path: "/chat/completions".into(),
        },
        Case {
            key: "bedrock_mantle_openai",
            model: "openai.gpt-oss-120b",
            env: aws(vec![("FABRIC_LLM_BASE_URL", url.to_owned()), ("AWS_BEARER_TOKEN_BEDROCK", SECRET.to_owned())]),
            credentials: "api key: set (from AWS_BEARER_TOKEN_BEDROCK)".into(),
            path: "/chat/completions".into(),
        },
        Case {
            key: "meta",
            model: "muse-spark-1.1",
            env: vec![("MODEL_API_BASE", url.to_owned()), ("MODEL_API_KEY", SECRET.to_owned())],
            credentials: "api key: set (from MODEL_API_KEY)".into(),
            path: "/responses".into(),
        },
        Case {
            key: "langsmith",
            model: "gpt-4o-mini",
            env: vec![("LANGSMITH_GATEWAY", url.to_owned()), ("LANGSMITH_API_KEY", SECRET.to_owned())],
            credentials: "api key: set (from LANGSMITH_API_KEY)".into(),
            path: "/v1/responses".into(),
        },
        Case {
            key: "anthropic_bedrock",
            model: "anthropic.claude-3-5-haiku-20241022-v1:0",
            env: aws(vec![
                ("ANTHROPIC_BEDROCK_BASE_URL", url.to_owned()),
                ("AWS_ACCESS_KEY_ID", AWS_KEY_ID.to_owned()),
                ("AWS_SECRET_ACCESS_KEY", AWS_SECRET.to_owned()),
            ]),
            credentials: "credentials: AWS Signature Version 4 with keys from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".into(),
            path: "/model/anthropic.claude-3-5-haiku-20241022-v1:0/invoke".into(),
        },
        Case {
            key: "bedrock_mantle_anthropic",
            model: "anthropic.claude-haiku-4-5",
            env: aws(vec![("ANTHROPIC_BEDROCK_MANTLE_BASE_URL", url.to_owned()), ("AWS_BEARER_TOKEN_BEDROCK", SECRET.to_owned())]),
            credentials: "credentials: Bedrock API key (bearer) from AWS_BEARER_TOKEN_BEDROCK".into(),
            path: "/v1/messages".into(),
        },
        Case {
            key: "google_anthropic_vertex",
            model: "claude-sonnet-4-5@20250929",
            env: vec![("ANTHROPIC_VERTEX_BASE_URL", format!("{url}/v1")), ("GOOGLE_APPLICATION_CREDENTIALS", key_file.to_owned())],
            credentials: "credentials: service account fabric-test@fabric-test-project.iam.gserviceaccount.com".into(),
            path: "/v1/projects/fabric-test-project/locations/us-central1/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict".into(),
        },
    ]
}

#[tokio::test]
async fn every_remaining_key_resolves_probes_and_runs() {
    let (token_uri, _) = token_server().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("sa.json");
    let mut file: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("vertex/service-account.json")).unwrap()).unwrap();
    file["token_uri"] = json!(token_uri);
    std::fs::write(&key_file, file.to_string()).unwrap();
    for key in ["huggingface", "bedrock_mantle_openai", "meta", "langsmith", "anthropic_bedrock", "bedrock_mantle_anthropic", "google_anthropic_vertex"] {
        let kind = ProviderKind::from_key(key).unwrap_or_else(|| panic!("{key} has no backend"));
        let fake = fake(kind);
        let url = fake.start().await;
        let case = cases(&url, key_file.to_str().unwrap()).await.into_iter().find(|c| c.key == key).unwrap();
        let mut env = case.env.clone();
        env.push(("FABRIC_LLM_MODEL", format!("{key}:{}", case.model)));
        let out = fabric_cli(&["doctor", "--probe"], &env).await;
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{key}: {stdout}");
        assert!(stdout.contains(&format!("provider: {key}  model: {}", case.model)), "{key}: {stdout}");
        assert!(stdout.contains(&case.credentials), "{key}: {stdout}");
        assert!(stdout.contains("probe: ok in "), "{key}: {stdout}");
        for secret in [SECRET, AWS_SECRET, "token-0", "PRIVATE KEY"] {
            assert!(!stdout.contains(secret) && !stderr.contains(secret), "{key}: {secret} shown");
        }
        assert_eq!(fake.requests()[0].path, case.path, "{key}");
        let auth = fake.requests()[0].headers.get("authorization").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        match key {
            "anthropic_bedrock" => assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/") && auth.contains("/us-east-1/bedrock/"), "{auth}"),
            "google_anthropic_vertex" => assert_eq!(auth, "Bearer token-0"),
            _ => assert_eq!(auth, format!("Bearer {SECRET}"), "{key}"),
        }
        let out = fabric_cli(&["run", "support-triage", "--goal", GOAL], &env).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{key}: {stdout} {}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(r#""status":"completed""#), "{key}: {stdout}");
    }
}

#[tokio::test]
async fn endpoints_default_as_their_packages_build_them() {
    let doctor = |env: Vec<(&'static str, String)>| async move {
        let out = fabric_cli(&["doctor"], &env).await;
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let bearer = ("AWS_BEARER_TOKEN_BEDROCK", SECRET.to_owned());
    let region = ("AWS_REGION", "eu-west-3".to_owned());
    let out = doctor(vec![("FABRIC_LLM_MODEL", "bedrock_mantle_openai:openai.gpt-oss-120b".into()), region.clone(), bearer.clone()]).await;
    assert!(out.contains("base_url: https://bedrock-mantle.eu-west-3.api.aws/v1"), "{out}");
    // OpenAI's GPT models on Mantle: /openai/v1 and the Responses API.
    let out = doctor(vec![("FABRIC_LLM_MODEL", "bedrock_mantle_openai:openai.gpt-5.4".into()), region.clone(), bearer.clone()]).await;
    assert!(out.contains("base_url: https://bedrock-mantle.eu-west-3.api.aws/openai/v1"), "{out}");
    let out = doctor(vec![("FABRIC_LLM_MODEL", "bedrock_mantle_anthropic:anthropic.claude-haiku-4-5".into()), region.clone(), bearer.clone()]).await;
    assert!(out.contains("base_url: https://bedrock-mantle.eu-west-3.api.aws/anthropic"), "{out}");
    let out = doctor(vec![("FABRIC_LLM_MODEL", "anthropic_bedrock:anthropic.claude-3-5-haiku-20241022-v1:0".into()), region, bearer]).await;
    assert!(out.contains("base_url: https://bedrock-runtime.eu-west-3.amazonaws.com"), "{out}");
    let out = doctor(vec![("FABRIC_LLM_MODEL", "huggingface:meta-llama/Llama-3.3-70B-Instruct".into()), ("HUGGINGFACEHUB_API_TOKEN", SECRET.into())]).await;
    assert!(out.contains("base_url: https://router.huggingface.co/v1") && out.contains("api key: set (from HUGGINGFACEHUB_API_TOKEN)"), "{out}");
    let out =
        doctor(vec![("FABRIC_LLM_MODEL", "langsmith:gpt-4o-mini".into()), ("LANGSMITH_GATEWAY", "true".into()), ("LANGSMITH_API_KEY", SECRET.into())]).await;
    assert!(out.contains("base_url: https://gateway.smith.langchain.com/v1"), "{out}");
    let out = doctor(vec![("FABRIC_LLM_MODEL", "meta:muse-spark-1.1".into()), ("MODEL_API_KEY", SECRET.into())]).await;
    assert!(out.contains("base_url: https://api.meta.ai/v1"), "{out}");
    // Missing pieces are named.
    let out = doctor(vec![("FABRIC_LLM_MODEL", "meta:muse-spark-1.1".into())]).await;
    assert!(out.contains("configuration: ERROR MODEL_API_KEY: is required for provider meta"), "{out}");
    let out = doctor(vec![("FABRIC_LLM_MODEL", "bedrock_mantle_openai:openai.gpt-oss-120b".into())]).await;
    assert!(out.contains("configuration: ERROR AWS_REGION or AWS_DEFAULT_REGION: is required for provider bedrock_mantle_openai"), "{out}");
    let out = doctor(vec![("FABRIC_LLM_MODEL", "google_anthropic_vertex:claude-sonnet-4-5@20250929".into())]).await;
    assert!(out.contains("configuration: ERROR GOOGLE_APPLICATION_CREDENTIALS: is required for provider google_anthropic_vertex"), "{out}");
    assert!(!out.contains(SECRET));
}

#[tokio::test]
async fn ibm_exchanges_its_api_key_as_the_sdk_does_then_probes_and_runs() {
    let (token_url, exchanges) = crate::cloud_support::iam_server().await;
    let iam = token_url.trim_end_matches("/identity/token").to_owned();
    let fake = fake(ProviderKind::Ibm);
    let url = fake.start().await;
    let env = vec![
        ("FABRIC_LLM_MODEL", "ibm:ibm/granite-3-3-8b-instruct".to_owned()),
        ("WATSONX_URL", url),
        ("WATSONX_API_KEY", SECRET.to_owned()),
        ("WATSONX_PROJECT_ID", crate::cloud_support::IBM_PROJECT.to_owned()),
        ("FABRIC_IBM_IAM_URL", iam),
    ];
    let out = fabric_cli(&["doctor", "--probe"], &env).await;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("provider: ibm  model: ibm/granite-3-3-8b-instruct"), "{stdout}");
    assert!(stdout.contains(&format!("scope: project {} (from WATSONX_PROJECT_ID)", crate::cloud_support::IBM_PROJECT)), "{stdout}");
    assert!(stdout.contains("credentials: IBM Cloud IAM tokens for the API key from WATSONX_API_KEY; token endpoint http://127.0.0.1:"), "{stdout}");
    assert!(stdout.contains("WATSONX_API_KEY=<redacted>") && stdout.contains("probe: ok in "), "{stdout}");
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET) && !stdout.contains(crate::cloud_support::IAM_TOKEN), "{stdout}");
    // The exchange, as ibm-watsonx-ai sends it (the ibm wire fixture's `token_request`).
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(fixtures().join("wire/ibm.json")).unwrap()).unwrap();
    let theirs = &fixture["token_request"];
    let (content_type, authorization, form) = exchanges.lock().unwrap()[0].clone();
    assert_eq!(content_type, theirs["headers"]["content-type"].as_str().unwrap());
    assert_eq!(authorization, theirs["headers"]["authorization"].as_str().unwrap());
    assert_eq!(form.replace(SECRET, "<api-key>"), theirs["form"].as_str().unwrap());
    let sent = &fake.requests()[0];
    assert_eq!(sent.path, "/ml/v1/text/chat");
    assert_eq!(sent.query.as_deref(), Some("version=2026-10-14"));
    assert_eq!(sent.headers["authorization"].to_str().unwrap(), format!("Bearer {}", crate::cloud_support::IAM_TOKEN));
    assert_eq!(sent.body["project_id"], crate::cloud_support::IBM_PROJECT);
    let out = fabric_cli(&["run", "support-triage", "--goal", GOAL], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(r#""status":"completed""#), "{stdout}");
    // Missing pieces are named; an API key never goes to a plain-HTTP URL elsewhere.
    let doctor = |env: Vec<(&'static str, String)>| async move { String::from_utf8_lossy(&fabric_cli(&["doctor"], &env).await.stdout).into_owned() };
    let out = doctor(vec![("FABRIC_LLM_MODEL", "ibm:ibm/granite-3-3-8b-instruct".into())]).await;
    assert!(out.contains("configuration: ERROR WATSONX_URL: is required for provider ibm"), "{out}");
    let base = vec![("FABRIC_LLM_MODEL", "ibm:m".to_owned()), ("WATSONX_URL", "https://us-south.ml.cloud.ibm.com".to_owned())];
    let out = doctor(base.clone()).await;
    assert!(out.contains("configuration: ERROR WATSONX_PROJECT_ID or WATSONX_SPACE_ID: is required for provider ibm"), "{out}");
    let mut env = base.clone();
    env.push(("WATSONX_SPACE_ID", "space-1".into()));
    let out = doctor(env.clone()).await;
    assert!(out.contains("configuration: ERROR WATSONX_API_KEY or WATSONX_APIKEY: is required for provider ibm"), "{out}");
    env.push(("WATSONX_APIKEY", SECRET.into()));
    let out = doctor(env).await;
    assert!(out.contains("token endpoint https://iam.cloud.ibm.com/identity/token") && out.contains("scope: space space-1"), "{out}");
    assert!(out.contains("WATSONX_APIKEY=<redacted>") && !out.contains(SECRET), "{out}");
    let out = doctor(vec![
        ("FABRIC_LLM_MODEL", "ibm:m".into()),
        ("WATSONX_URL", "http://watsonx.internal".into()),
        ("WATSONX_PROJECT_ID", "p".into()),
        ("WATSONX_API_KEY", SECRET.into()),
    ])
    .await;
    assert!(out.contains("configuration: ERROR WATSONX_API_KEY: is sent only over HTTPS"), "{out}");
}

#[tokio::test]
async fn mantle_openai_makes_short_term_api_keys_from_aws_keys() {
    let fake = fake(ProviderKind::from_key("bedrock_mantle_openai").unwrap());
    let url = fake.start().await;
    let env = vec![
        ("FABRIC_LLM_MODEL", "bedrock_mantle_openai:openai.gpt-oss-120b".to_owned()),
        ("FABRIC_LLM_BASE_URL", url),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", AWS_KEY_ID.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", AWS_SECRET.to_owned()),
    ];
    let out = fabric_cli(&["doctor", "--probe"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("credentials: short-term Bedrock API keys (bearer, 12 h) made from the keys of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        "{stdout}"
    );
    assert!(stdout.contains("probe: ok in ") && !stdout.contains(AWS_SECRET) && !stdout.contains("bedrock-api-key-"), "{stdout}");
    let auth = fake.requests()[0].headers["authorization"].to_str().unwrap().to_owned();
    let token = auth.strip_prefix("Bearer bedrock-api-key-").unwrap_or_else(|| panic!("{auth}"));
    use base64::Engine as _;
    let url = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(token).unwrap()).unwrap();
    assert!(url.starts_with("bedrock.amazonaws.com/?Action=CallWithBearerToken&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F"), "{url}");
    assert!(url.contains("%2Fus-east-1%2Fbedrock%2Faws4_request") && url.contains("&X-Amz-Expires=43200&") && url.ends_with("&Version=1"), "{url}");
    // OpenAI's GPT models on Mantle go to the Responses API, as ChatOpenAIMantle sends them.
    let mut env = env;
    env[0].1 = "bedrock_mantle_openai:openai.gpt-5.4".to_owned();
    let out = fabric_cli(&["doctor", "--probe"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("probe: ok in "), "{stdout}");
    let last = fake.requests().last().cloned().unwrap();
    assert_eq!(last.path, "/responses");
    assert_eq!(last.body["model"], "openai.gpt-5.4");
    assert!(last.body.pointer("/text/format/schema").is_some(), "{}", last.body);
}
