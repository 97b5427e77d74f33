//! The OpenAI-compatible family, Azure OpenAI and Mistral through the `fabric` CLI and the full
//! stack: each key resolves from its package's own variables, `fabric doctor` shows where its
//! endpoint and key came from (never the key), `--probe` reaches it, a 429's `Retry-After` is
//! honoured, and a redirect to another origin takes no key along. (Requests and readings against
//! LangChain's packages are in `wire.rs`.)

use std::time::{Duration, Instant};

use fabric::config::ProviderKind;
use fabric::llm::providers::compat::endpoint;
use serde_json::json;

use crate::support::{Canned, FakeProvider, compat_reply, fabric_cli};

/// Every family key with the model of its fixture.
const KEYS: &[(&str, &str)] = &[
    ("deepseek", "deepseek-chat"),
    ("groq", "llama-3.3-70b-versatile"),
    ("xai", "grok-4"),
    ("fireworks", "accounts/fireworks/models/llama-v3p3-70b-instruct"),
    ("together", "meta-llama/Llama-3.3-70B-Instruct-Turbo"),
    ("openrouter", "openai/gpt-4o-mini"),
    ("perplexity", "sonar"),
    ("nvidia", "meta/llama-3.1-8b-instruct"),
    ("upstage", "solar-pro2"),
    ("baseten", "deepseek-ai/DeepSeek-V3.1"),
    ("litellm", "gpt-4o-mini"),
    ("azure_ai", "gpt-4o-mini"),
    ("azure_openai", "gpt-4o-mini"),
    ("mistralai", "mistral-large-latest"),
];

const SECRET: &str = "sk-family-secret-0001";

fn probe_fake() -> FakeProvider {
    FakeProvider::new(|body| Canned::json(200, compat_reply(body, &json!({"ok": true}))))
}

#[tokio::test]
async fn every_family_key_resolves_shows_its_sources_and_probes() {
    for (key, model) in KEYS {
        let kind = ProviderKind::from_key(key).unwrap_or_else(|| panic!("{key} has no backend"));
        let ProviderKind::Compat(c) = kind else { panic!("{key} is not in the family") };
        let e = endpoint(c);
        let fake = probe_fake();
        let url = fake.start().await;
        let (url_var, key_var) = (e.base_url_vars[0], e.key_vars[0]);
        let mut env = vec![("FABRIC_LLM_MODEL", format!("{key}:{model}")), (url_var, url.clone()), (key_var, SECRET.to_owned())];
        if *key == "azure_openai" {
            env.push(("OPENAI_API_VERSION", "2024-10-21".to_owned()));
        }
        let out = fabric_cli(&["doctor", "--probe"], &env).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{key}: {stdout}");
        assert!(stdout.contains(&format!("provider: {key}  model: {model}")), "{key}: {stdout}");
        assert!(stdout.contains(&format!("api key: set (from {key_var})")), "{key}: {stdout}");
        assert!(stdout.contains(&format!("{key_var}=<redacted>")), "{key}: {stdout}");
        assert!(stdout.contains("probe: ok in ") && stdout.contains(r#"{"ok":true}"#), "{key}: {stdout}");
        assert!(!stdout.contains(SECRET) && !String::from_utf8_lossy(&out.stderr).contains(SECRET), "{key}: the key is shown");
        let sent = &fake.requests()[0];
        assert!(sent.path.ends_with("/chat/completions"), "{key}: {}", sent.path);
        let auth = if *key == "azure_openai" { "api-key" } else { "authorization" };
        assert!(sent.headers[auth].to_str().unwrap().contains(SECRET), "{key}: the key goes as {auth}");
    }
}

#[tokio::test]
async fn a_family_key_without_its_endpoint_or_key_is_refused_by_name() {
    let out = fabric_cli(&["doctor"], &[("FABRIC_LLM_MODEL", "groq:llama-3.3-70b-versatile".to_owned())]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration: ERROR GROQ_API_KEY: is required for provider groq"));
    let out = fabric_cli(&["doctor"], &[("FABRIC_LLM_MODEL", "litellm:gpt-4o-mini".to_owned())]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("LITELLM_PROXY_API_BASE or FABRIC_LLM_BASE_URL: is required for provider litellm"));
    let env = [("FABRIC_LLM_MODEL", "azure_openai:prod".to_owned()), ("AZURE_OPENAI_ENDPOINT", "https://r.openai.azure.com".to_owned())];
    let out = fabric_cli(&["doctor"], &env).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("OPENAI_API_VERSION: is required for provider azure_openai"));
    let out = fabric_cli(&["doctor"], &[("FABRIC_LLM_MODEL", "huggingface:meta-llama/Llama-3.1-8B-Instruct".to_owned())]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("HF_TOKEN or HUGGINGFACEHUB_API_TOKEN: is required for provider huggingface"), "{stdout}");
    // The runtime's own override, after the package's variables.
    let fake = probe_fake();
    let url = fake.start().await;
    let env = [("FABRIC_LLM_MODEL", "deepseek:deepseek-chat".to_owned()), ("FABRIC_LLM_BASE_URL", url.clone())];
    let out = fabric_cli(&["doctor"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("base_url: {url}")) && stdout.contains("api key: none"), "{stdout}");
}

#[tokio::test]
async fn a_429_waits_its_retry_after_and_a_redirect_takes_no_key() {
    let fake = probe_fake();
    let mut limited = Canned::json(429, json!({"error": {"message": "slow down", "type": "rate_limit_exceeded", "code": "rate_limit_exceeded"}}));
    limited.headers.push(("retry-after", "1".to_owned()));
    fake.push(limited);
    let url = fake.start().await;
    let env = [
        ("FABRIC_LLM_MODEL", "groq:llama-3.3-70b-versatile".to_owned()),
        ("GROQ_BASE_URL", url),
        ("GROQ_API_KEY", SECRET.to_owned()),
        ("FABRIC_LLM_RETRY_BASE_S", "0.01".to_owned()),
    ];
    let started = Instant::now();
    let out = fabric_cli(&["doctor", "--probe"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("probe: ok in "), "{stdout}");
    assert_eq!(fake.requests().len(), 2, "one retry after the 429");
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After: 1 waited, not the 10 ms backoff");
    assert_eq!(fake.requests()[0].path, "/openai/v1/chat/completions");

    // A 307 to another origin: the call fails, and the other origin sees nothing.
    let elsewhere = probe_fake();
    let other = elsewhere.start().await;
    let redirecting = FakeProvider::new(move |_| {
        let mut c = Canned::json(307, json!({}));
        c.headers.push(("location", format!("{other}/openai/deployments/prod/chat/completions")));
        c
    });
    let url = redirecting.start().await;
    let env = [
        ("FABRIC_LLM_MODEL", "azure_openai:prod".to_owned()),
        ("AZURE_OPENAI_ENDPOINT", url),
        ("AZURE_OPENAI_API_KEY", SECRET.to_owned()),
        ("OPENAI_API_VERSION", "2024-10-21".to_owned()),
        ("FABRIC_LLM_RETRY_MAX", "1".to_owned()),
    ];
    let out = fabric_cli(&["doctor", "--probe"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("probe: FAILED"), "{stdout}");
    assert!(!stdout.contains(SECRET), "{stdout}");
    assert_eq!(redirecting.requests().len(), 1);
    assert!(elsewhere.requests().is_empty(), "the redirect was followed with the key");
}

#[tokio::test]
async fn cohere_resolves_shows_its_sources_and_probes() {
    let fake = FakeProvider::new(|_| Canned::json(200, crate::support::cohere_reply(&json!({"ok": true}))));
    let url = fake.start().await;
    let env = [("FABRIC_LLM_MODEL", "cohere:command-a-03-2025".to_owned()), ("CO_API_URL", url), ("CO_API_KEY", SECRET.to_owned())];
    let out = fabric_cli(&["doctor", "--probe"], &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("provider: cohere  model: command-a-03-2025") && stdout.contains("api key: set (from CO_API_KEY)"), "{stdout}");
    assert!(stdout.contains("probe: ok in ") && !stdout.contains(SECRET), "{stdout}");
    let sent = &fake.requests()[0];
    assert_eq!(sent.path, "/v2/chat");
    assert_eq!(sent.headers["authorization"].to_str().unwrap(), format!("Bearer {SECRET}"));
}
