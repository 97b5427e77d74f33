//! What the cloud providers' tests share (cloud.rs, and wire.rs for the fixtures of Bedrock and
//! Vertex AI): the fixtures' fake credentials, a token server that checks a service account's JWT
//! with its public key, and the readings that put our requests and LangChain's side by side.

use std::sync::{Arc, Mutex};

use axum::response::IntoResponse;
use fabric::config::{ApiKey, ProviderKind, ProviderTarget};
use fabric::llm::cloud::{AwsKeys, Cloud, ServiceAccount};
use serde_json::{Value, json};

use crate::support::{fixtures, serve, target};

/// The fixtures' fake AWS keys (the AWS documentation's example ones; valid nowhere).
pub const AWS_KEY_ID: &str = "AKIDEXAMPLE";
pub const AWS_SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

/// `path?query` as (path, query).
pub fn split_query(path: &str) -> (&str, Option<&str>) {
    match path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path, None),
    }
}

/// A header of ours as the wire fixtures show LangChain's: a SigV4 signature without its date
/// and signature (they cover the time and the port), `x-amz-date` as `<date>`.
pub fn scrub_header(name: &str, value: &str) -> String {
    if name == "x-amz-date" {
        return "<date>".into();
    }
    if name == "authorization"
        && let Some(rest) = value.strip_prefix("AWS4-HMAC-SHA256 Credential=")
        && let Some((key, scope)) = rest.split_once('/')
        && let Some((_date, scope)) = scope.split_once('/')
        && let Some((head, _signature)) = scope.rsplit_once("Signature=")
    {
        return format!("AWS4-HMAC-SHA256 Credential={key}/<date>/{head}Signature=<signature>");
    }
    value.to_owned()
}

/// LangChain's Vertex AI request as proto JSON with enum names: its REST client asks for
/// `enum-encoding=int`, so a schema `type` is `6` where we write `OBJECT`, the calling mode `2`
/// where we write `ANY` (google.cloud.aiplatform.v1beta1 `Type` and `FunctionCallingConfig.Mode`).
pub fn proto_enum_names(body: &Value) -> Value {
    const TYPES: [&str; 8] = ["TYPE_UNSPECIFIED", "STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"];
    const MODES: [&str; 5] = ["MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"];
    fn types(v: &mut Value) {
        if let Some(map) = v.as_object_mut() {
            if let Some(n) = map.get("type").and_then(Value::as_u64) {
                map.insert("type".into(), json!(TYPES.get(n as usize).copied().unwrap_or("?")));
            }
            if let Some(Value::Object(props)) = map.get_mut("properties") {
                props.values_mut().for_each(types);
            }
            if let Some(items) = map.get_mut("items") {
                types(items);
            }
        }
    }
    let mut body = body.clone();
    if let Some(params) = body.pointer_mut("/tools/0/functionDeclarations/0/parameters") {
        types(params);
    }
    if let Some(mode) = body.pointer_mut("/toolConfig/functionCallingConfig/mode")
        && let Some(n) = mode.as_u64()
    {
        *mode = json!(MODES.get(n as usize).copied().unwrap_or("?"));
    }
    body
}

/// The test service account (tests/fixtures/vertex, TEST ONLY) with its `token_uri` at `token_uri`.
pub fn test_account(token_uri: &str) -> ServiceAccount {
    let path = fixtures().join("vertex/service-account.json");
    let mut file: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    file["token_uri"] = json!(token_uri);
    ServiceAccount::parse(path.to_str().unwrap(), &file.to_string()).unwrap()
}

/// What the token server saw and answers.
#[derive(Default)]
pub struct Tokens {
    /// Each grant's verdict: the token it was given, or why the JWT was refused.
    pub grants: Mutex<Vec<Result<String, String>>>,
    /// `expires_in` of the next answers.
    pub expires_in: Mutex<Value>,
}

/// A token server that checks each JWT grant with the test account's public key (RS256, issuer,
/// audience, scope, lifetime) and answers a new token `token-N`; a bad grant gets OAuth's 400.
pub async fn token_server() -> (String, Arc<Tokens>) {
    let tokens = Arc::new(Tokens { expires_in: Mutex::new(json!(3599)), ..Tokens::default() });
    let seen = tokens.clone();
    let app = axum::Router::new().route(
        "/token",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let tokens = seen.clone();
            async move {
                let verdict = check_grant(&headers, &body, tokens.grants.lock().unwrap().len());
                tokens.grants.lock().unwrap().push(verdict.clone());
                match verdict {
                    Ok(token) => {
                        let expires_in = tokens.expires_in.lock().unwrap().clone();
                        axum::Json(json!({"access_token": token, "expires_in": expires_in, "token_type": "Bearer"})).into_response()
                    }
                    Err(_) => {
                        (axum::http::StatusCode::BAD_REQUEST, axum::Json(json!({"error": "invalid_grant", "error_description": "bad JWT"}))).into_response()
                    }
                }
            }
        }),
    );
    let url = serve(app).await;
    (format!("{url}/token"), tokens)
}

fn check_grant(headers: &axum::http::HeaderMap, body: &str, n: usize) -> Result<String, String> {
    if headers.get("content-type").and_then(|v| v.to_str().ok()) != Some("application/x-www-form-urlencoded") {
        return Err("not a form".into());
    }
    let form: std::collections::HashMap<String, String> = url::form_urlencoded::parse(body.as_bytes()).into_owned().collect();
    if form.get("grant_type").map(String::as_str) != Some("urn:ietf:params:oauth:grant-type:jwt-bearer") {
        return Err("wrong grant_type".into());
    }
    let jwt = form.get("assertion").ok_or("no assertion")?;
    let public = std::fs::read(fixtures().join("vertex/public-key.pem")).unwrap();
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(&public).unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_issuer(&["fabric-test@fabric-test-project.iam.gserviceaccount.com"]);
    // The audience is the token_uri, whose port changes: checked below.
    validation.validate_aud = false;
    let data = jsonwebtoken::decode::<Value>(jwt, &key, &validation).map_err(|e| format!("JWT refused: {e}"))?;
    let claims = data.claims;
    if data.header.kid.as_deref() != Some("0123456789abcdef0123456789abcdef01234567") {
        return Err("wrong kid".into());
    }
    if claims["scope"] != "https://www.googleapis.com/auth/cloud-platform" || !claims["aud"].as_str().unwrap_or("").ends_with("/token") {
        return Err(format!("wrong scope or audience: {claims}"));
    }
    if claims["exp"].as_u64().unwrap_or(0).saturating_sub(claims["iat"].as_u64().unwrap_or(0)) != 3600 {
        return Err("wrong lifetime".into());
    }
    Ok(format!("token-{n}"))
}

/// The target of a wire fixture's provider at `url`: the test keys for Bedrock (signed), the
/// test account with its own token server for Vertex AI.
pub async fn wire_target(kind: ProviderKind, url: &str, model: &str) -> ProviderTarget {
    let mut t = target(kind, url, model);
    match kind {
        ProviderKind::Bedrock
        | ProviderKind::BedrockConverse
        | ProviderKind::HostedAnthropic(fabric::vocab::AnthropicHost::Bedrock | fabric::vocab::AnthropicHost::Mantle) => {
            t.api_key = None;
            t.cloud = Some(Cloud::Bedrock { region: "us-east-1".into(), region_var: "AWS_REGION", keys: Some(test_keys(None)) });
        }
        ProviderKind::VertexAi | ProviderKind::HostedAnthropic(fabric::vocab::AnthropicHost::Vertex) => {
            let (token_uri, _) = token_server().await;
            t.api_key = None;
            let account = test_account(&token_uri);
            t.cloud = Some(Cloud::Vertex {
                project: "fabric-test-project".into(),
                project_from: "test".into(),
                location: "us-central1".into(),
                location_from: "test".into(),
                account,
            });
        }
        ProviderKind::Ibm => {
            let (iam, _) = iam_server().await;
            t.api_key = None;
            let iam = fabric::llm::cloud::IamKey { api_key: ApiKey::new("test-key-123".into()), var: "WATSONX_API_KEY".into(), token_url: iam };
            t.cloud =
                Some(Cloud::Watsonx { scope: fabric::llm::cloud::WatsonxScope::Project(IBM_PROJECT.into()), scope_var: "WATSONX_PROJECT_ID", iam: Some(iam) });
        }
        _ => {}
    }
    t
}

/// The wire fixture's watsonx.ai project.
pub const IBM_PROJECT: &str = "00000000-0000-4000-8000-000000000001";
/// The token a fake IAM endpoint issues: the placeholder the ibm fixture shows in its place.
pub const IAM_TOKEN: &str = "<iam-token>";

/// A fake IBM Cloud IAM endpoint: its token URL, and every exchange it saw (content type,
/// authorization, form).
pub async fn iam_server() -> (String, Arc<Mutex<Vec<(String, String, String)>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = axum::Router::new().route(
        "/identity/token",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let log = log.clone();
            async move {
                let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                log.lock().unwrap().push((h("content-type"), h("authorization"), body));
                axum::Json(json!({"access_token": IAM_TOKEN, "refresh_token": "not_supported", "token_type": "Bearer", "expires_in": 3600, "expiration": 4102444800u64}))
            }
        }),
    );
    let url = serve(app).await;
    (format!("{url}/identity/token"), seen)
}

pub fn test_keys(session_token: Option<&str>) -> AwsKeys {
    AwsKeys {
        access_key_id: ApiKey::new(AWS_KEY_ID.into()),
        secret_access_key: ApiKey::new(AWS_SECRET.into()),
        session_token: session_token.map(|t| ApiKey::new(t.into())),
    }
}

/// A fixture reply's headers (Bedrock's `x-amzn-ErrorType`) for the fake provider, which takes
/// static names: the ones the fixtures use.
pub fn canned_headers(headers: &Value) -> Vec<(&'static str, String)> {
    let Some(map) = headers.as_object() else { return Vec::new() };
    map.iter()
        .map(|(k, v)| {
            let name = match k.to_ascii_lowercase().as_str() {
                "x-amzn-errortype" => "x-amzn-errortype",
                other => panic!("a wire fixture's reply header `{other}` is not known to canned_headers"),
            };
            (name, v.as_str().unwrap().to_owned())
        })
        .collect()
}
