//! The cloud providers' targets from the environment, read as the reference's packages read it:
//! Bedrock as boto3 and langchain-aws do, Vertex AI as google-auth and ChatVertexAI do.
//!
//! Only environment credentials are read: AWS keys or the Bedrock API key, a Google service
//! account's key file. AWS profiles, SSO, instance roles and Google's metadata server are not.

use crate::llm::cloud::{AwsKeys, Cloud, IamKey, ServiceAccount, WatsonxScope};
use crate::llm::model::{ApiKey, ProviderKind, ProviderTarget, check_key};
use crate::vocab::{AnthropicHost, ConfigError, err, parse_base_url};

/// Secrets whose names do not end in `_API_KEY` or `_TOKEN`: read only from the environment and
/// never shown. (`AWS_ACCESS_KEY_ID` names a key rather than being one, but it is kept as close.)
pub const SECRETS: &[&str] = &["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_BEARER_TOKEN_BEDROCK", "WATSONX_APIKEY"];

/// The largest service-account key file read (a real one is about 2.4 KB).
const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;
/// ChatVertexAI's default location.
pub const DEFAULT_VERTEX_LOCATION: &str = "us-central1";

/// The first of `vars` that is set, with its name.
pub(super) fn first<'v>(var: &dyn Fn(&str) -> Option<String>, vars: &[&'v str]) -> Option<(&'v str, String)> {
    vars.iter().find_map(|v| var(v).map(|value| (*v, value.trim().to_owned())))
}

/// A region or location: lower-case letters, digits and `-` (it goes into a host name).
pub(super) fn region(var: &str, value: &str) -> Result<String, ConfigError> {
    if !value.is_empty() && value.len() <= 64 && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        Ok(value.to_owned())
    } else {
        Err(err(var, format!("`{value}` is not a region such as us-east-1")))
    }
}

/// A URL on this machine: `localhost` or a loopback address.
fn is_loopback(url: &str) -> bool {
    match reqwest::Url::parse(url).ok().and_then(|u| u.host().map(|h| h.to_owned())) {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// A target for Bedrock or Vertex AI. `base_url` and `key_var` are a model profile's.
pub fn target(
    var: &dyn Fn(&str) -> Option<String>,
    provider: ProviderKind,
    model: String,
    base_url: Option<&str>,
    key_var: Option<&str>,
) -> Result<ProviderTarget, ConfigError> {
    match provider {
        ProviderKind::VertexAi | ProviderKind::HostedAnthropic(AnthropicHost::Vertex) => vertex(var, provider, model, base_url),
        ProviderKind::Ibm => watsonx(var, model, base_url, key_var),
        _ => bedrock(var, provider, model, base_url, key_var),
    }
}

/// Where a Bedrock provider's endpoint is read from, in its package's order (the runtime's
/// `FABRIC_LLM_BASE_URL` after the package's own where the package reads none of AWS's), its
/// default for a region, and the variables of the Bedrock API key.
fn bedrock_endpoint(provider: ProviderKind, region: &str) -> (&'static [&'static str], String, &'static [&'static str]) {
    match provider {
        // The anthropic SDK's AnthropicBedrock reads ANTHROPIC_BEDROCK_BASE_URL only.
        ProviderKind::HostedAnthropic(AnthropicHost::Bedrock) => {
            (&["ANTHROPIC_BEDROCK_BASE_URL", "FABRIC_LLM_BASE_URL"], format!("https://bedrock-runtime.{region}.amazonaws.com"), &["AWS_BEARER_TOKEN_BEDROCK"])
        }
        // ChatAnthropicMantle passes ANTHROPIC_API_URL / ANTHROPIC_BASE_URL on (unless they name
        // api.anthropic.com); AnthropicBedrockMantle reads ANTHROPIC_BEDROCK_MANTLE_BASE_URL.
        ProviderKind::HostedAnthropic(AnthropicHost::Mantle) => (
            &["ANTHROPIC_API_URL", "ANTHROPIC_BASE_URL", "ANTHROPIC_BEDROCK_MANTLE_BASE_URL", "FABRIC_LLM_BASE_URL"],
            format!("https://bedrock-mantle.{region}.api.aws/anthropic"),
            &["AWS_BEARER_TOKEN_BEDROCK", "ANTHROPIC_AWS_API_KEY"],
        ),
        _ => (
            &["BEDROCK_ENDPOINT_URL", "AWS_ENDPOINT_URL_BEDROCK_RUNTIME", "AWS_ENDPOINT_URL"],
            format!("https://bedrock-runtime.{region}.amazonaws.com"),
            &["AWS_BEARER_TOKEN_BEDROCK"],
        ),
    }
}

fn bedrock(
    var: &dyn Fn(&str) -> Option<String>,
    provider: ProviderKind,
    model: String,
    base_url: Option<&str>,
    key_var: Option<&str>,
) -> Result<ProviderTarget, ConfigError> {
    let (region_var, value) = first(var, &["AWS_REGION", "AWS_DEFAULT_REGION"])
        .ok_or_else(|| err("AWS_REGION or AWS_DEFAULT_REGION", format!("is required for provider {} (model `{model}`) and is not set", provider.key())))?;
    let region = region(region_var, &value)?;
    let (url_vars, default_url, bearer_vars) = bedrock_endpoint(provider, &region);
    // An Anthropic URL is the `anthropic:` key's, which ChatAnthropicMantle does not take over.
    let not_anthropic = |v: &str| var(v).filter(|u| !u.contains("api.anthropic.com"));
    let base_url = match (base_url, url_vars.iter().find_map(|v| not_anthropic(v).map(|u| (*v, u)))) {
        (Some(u), _) => parse_base_url("model profile base_url", u)?,
        (None, Some((v, u))) => parse_base_url(v, &u)?,
        (None, None) => default_url,
    };
    // The Bedrock API key first, as botocore prefers it when it is set; else the access keys.
    let found = match key_var {
        Some(v) => var(v).map(|k| (v, k)),
        None => bearer_vars.iter().find_map(|v| var(v).map(|k| (*v, k))),
    };
    let bearer_var = key_var.unwrap_or(bearer_vars[0]);
    let (api_key, api_key_var, keys) = match found.map(|(v, k)| (v, k.trim().to_owned())) {
        Some((bearer_var, token)) => {
            check_key(bearer_var, &token)?;
            // A bearer token goes in clear text: only over TLS, as botocore insists, or to this
            // machine (a local proxy, the tests).
            if !base_url.starts_with("https://") && !is_loopback(&base_url) {
                return Err(err(
                    bearer_var,
                    format!("is sent only over HTTPS, and the Bedrock endpoint `{}` is plain HTTP", crate::redact::redact_url(&base_url)),
                ));
            }
            (Some(ApiKey::new(token)), Some(bearer_var.to_owned()), None)
        }
        // A profile that names its key variable means that key, not the access keys.
        None if key_var.is_some() => {
            return Err(err(bearer_var, format!("is required for provider {} (model `{model}`) and is not set", provider.key())));
        }
        None => (None, None, Some(aws_keys(var, provider, &model)?)),
    };
    Ok(ProviderTarget { provider, model, base_url, api_key, api_key_var, api_version: String::new(), cloud: Some(Cloud::Bedrock { region, region_var, keys }) })
}

pub(super) fn aws_keys(var: &dyn Fn(&str) -> Option<String>, provider: ProviderKind, model: &str) -> Result<AwsKeys, ConfigError> {
    let get = |v: &str| -> Result<Option<ApiKey>, ConfigError> {
        match var(v).map(|k| k.trim().to_owned()) {
            Some(k) => check_key(v, &k).map(|()| Some(ApiKey::new(k))),
            None => Ok(None),
        }
    };
    match (get("AWS_ACCESS_KEY_ID")?, get("AWS_SECRET_ACCESS_KEY")?) {
        (Some(access_key_id), Some(secret_access_key)) => Ok(AwsKeys { access_key_id, secret_access_key, session_token: get("AWS_SESSION_TOKEN")? }),
        (Some(_), None) => Err(err("AWS_SECRET_ACCESS_KEY", "is required with AWS_ACCESS_KEY_ID and is not set")),
        (None, Some(_)) => Err(err("AWS_ACCESS_KEY_ID", "is required with AWS_SECRET_ACCESS_KEY and is not set")),
        (None, None) => Err(err(
            "AWS_BEARER_TOKEN_BEDROCK or AWS_ACCESS_KEY_ID",
            format!(
                "is required for provider {} (model `{model}`) and is not set: set the Bedrock API key, or AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY (AWS profiles, SSO and instance roles are not read)",
                provider.key()
            ),
        )),
    }
}

fn vertex(var: &dyn Fn(&str) -> Option<String>, provider: ProviderKind, model: String, base_url: Option<&str>) -> Result<ProviderTarget, ConfigError> {
    const CREDS: &str = "GOOGLE_APPLICATION_CREDENTIALS";
    let key = provider.key();
    let path = var(CREDS).map(|p| p.trim().to_owned()).ok_or_else(|| {
        err(
            CREDS,
            format!(
                "is required for provider {key} (model `{model}`) and is not set: set it to a service account's JSON key file \
                 (gcloud's user credentials and the metadata server are not read)"
            ),
        )
    })?;
    let text = crate::textfile::read_bounded(std::path::Path::new(&path), MAX_KEY_FILE_BYTES).map_err(|e| err(CREDS, format!("`{path}`: {e}")))?;
    let account = ServiceAccount::parse(&path, &text).map_err(|e| err(CREDS, format!("`{path}` {e}")))?;
    // As ChatVertexAI finds it: aiplatform's variables, google-auth's, then the key file's.
    let (project, project_from) = match first(var, &["GOOGLE_CLOUD_PROJECT", "CLOUD_ML_PROJECT_ID", "GCLOUD_PROJECT"]) {
        Some((v, p)) => (p, v.to_owned()),
        None => match &account.project_id {
            Some(p) => (p.clone(), format!("project_id of {path}")),
            None => return Err(err("GOOGLE_CLOUD_PROJECT", format!("is required for provider {key}: `{path}` names no project_id"))),
        },
    };
    if project.is_empty() || !project.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':')) {
        return Err(err(&project_from, format!("`{project}` is not a Google Cloud project id")));
    }
    let (location, location_from) = match first(var, &["GOOGLE_CLOUD_REGION", "CLOUD_ML_REGION"]) {
        Some((v, l)) => (region(v, &l)?, v.to_owned()),
        None => (DEFAULT_VERTEX_LOCATION.to_owned(), "default".to_owned()),
    };
    // ChatVertexAI's endpoint is a host; AnthropicVertex's ends in its API version (/v1) and is
    // read from ANTHROPIC_VERTEX_BASE_URL, with the multi-region hosts the anthropic SDK knows.
    let claude = provider != ProviderKind::VertexAi;
    let url_vars: &[&str] = if claude { &["ANTHROPIC_VERTEX_BASE_URL", "FABRIC_LLM_BASE_URL"] } else { &["GOOGLE_VERTEX_BASE_URL"] };
    let base_url = match (base_url, first(var, url_vars)) {
        (Some(u), _) => parse_base_url("model profile base_url", u)?,
        (None, Some((v, u))) => parse_base_url(v, &u)?,
        (None, None) => {
            let host = match location.as_str() {
                "global" => "https://aiplatform.googleapis.com".to_owned(),
                "us" | "eu" if claude => format!("https://aiplatform.{location}.rep.googleapis.com"),
                _ => format!("https://{location}-aiplatform.googleapis.com"),
            };
            if claude { format!("{host}/v1") } else { host }
        }
    };
    Ok(ProviderTarget {
        provider,
        model,
        base_url,
        api_key: None,
        api_key_var: None,
        api_version: crate::llm::providers::vertex::API_VERSION.to_owned(),
        cloud: Some(Cloud::Vertex { project, project_from, location, location_from, account }),
    })
}

/// IBM watsonx.ai as langchain-ibm's ChatWatsonx reads it: `WATSONX_URL` (the region's URL),
/// `WATSONX_PROJECT_ID` or `WATSONX_SPACE_ID`, and `WATSONX_API_KEY` (or the deprecated
/// `WATSONX_APIKEY`), exchanged at IBM Cloud's IAM endpoint, or `WATSONX_TOKEN`, sent as it is.
fn watsonx(var: &dyn Fn(&str) -> Option<String>, model: String, base_url: Option<&str>, key_var: Option<&str>) -> Result<ProviderTarget, ConfigError> {
    let need = |what: &str, example: &str| format!("is required for provider ibm (model `{model}`) and is not set: {what}, e.g. {example}");
    let base_url = match (base_url, first(var, &["WATSONX_URL", "FABRIC_LLM_BASE_URL"])) {
        (Some(u), _) => parse_base_url("model profile base_url", u)?,
        (None, Some((v, u))) => parse_base_url(v, &u)?,
        (None, None) => return Err(err("WATSONX_URL", need("your watsonx.ai region's URL", "https://us-south.ml.cloud.ibm.com"))),
    };
    let id = |v: &str, value: String| {
        if !value.is_empty() && value.len() <= 64 && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            Ok(value)
        } else {
            Err(err(v, format!("`{value}` is not a watsonx.ai project or space id")))
        }
    };
    let (scope, scope_var) = match (first(var, &["WATSONX_PROJECT_ID"]), first(var, &["WATSONX_SPACE_ID"])) {
        (Some((v, p)), _) => (WatsonxScope::Project(id(v, p)?), "WATSONX_PROJECT_ID"),
        (None, Some((v, s))) => (WatsonxScope::Space(id(v, s)?), "WATSONX_SPACE_ID"),
        (None, None) => return Err(err("WATSONX_PROJECT_ID or WATSONX_SPACE_ID", need("the project or deployment space the calls run in", "a project's id"))),
    };
    // A profile's key variable names an API key; else langchain-ibm's, the deprecated one after it.
    let keys: Vec<&str> = key_var.map_or_else(|| vec!["WATSONX_API_KEY", "WATSONX_APIKEY"], |v| vec![v]);
    let secure = |v: &str| -> Result<(), ConfigError> {
        if base_url.starts_with("https://") || is_loopback(&base_url) {
            Ok(())
        } else {
            Err(err(v, format!("is sent only over HTTPS, and the watsonx.ai URL `{}` is plain HTTP", crate::redact::redact_url(&base_url))))
        }
    };
    let (api_key, api_key_var, iam) = match (first(var, &keys), first(var, &["WATSONX_TOKEN"])) {
        (Some((v, key)), _) => {
            check_key(v, &key)?;
            // IBM Cloud's IAM, as the SDK picks it for the cloud's regions; FABRIC_IBM_IAM_URL for
            // another (a private IAM proxy, the tests).
            let iam = match var("FABRIC_IBM_IAM_URL") {
                Some(u) => parse_base_url("FABRIC_IBM_IAM_URL", &u)?,
                None => crate::llm::providers::watsonx::IAM_URL.to_owned(),
            };
            if !iam.starts_with("https://") && !is_loopback(&iam) {
                return Err(err("FABRIC_IBM_IAM_URL", format!("`{}` is plain HTTP; the API key is sent only over HTTPS", crate::redact::redact_url(&iam))));
            }
            (None, None, Some(IamKey { api_key: ApiKey::new(key), var: v.to_owned(), token_url: format!("{iam}/identity/token") }))
        }
        (None, Some((v, token))) if key_var.is_none() => {
            check_key(v, &token)?;
            secure(v)?;
            (Some(ApiKey::new(token)), Some(v.to_owned()), None)
        }
        _ => return Err(err(&keys.join(" or "), need("an IBM Cloud API key (or WATSONX_TOKEN, a token)", "the key of a service ID"))),
    };
    if iam.is_some() {
        secure(keys[0])?;
    }
    Ok(ProviderTarget {
        provider: ProviderKind::Ibm,
        model,
        base_url,
        api_key,
        api_key_var,
        api_version: String::new(),
        cloud: Some(Cloud::Watsonx { scope, scope_var, iam }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(vars: &[(&str, &str)], provider: ProviderKind, key_var: Option<&str>) -> Result<ProviderTarget, ConfigError> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        target(&|k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()), provider, "m".into(), None, key_var)
    }

    #[test]
    fn bedrock_reads_region_endpoint_and_keys_as_boto3() {
        let keys = [("AWS_DEFAULT_REGION", "eu-west-3"), ("AWS_ACCESS_KEY_ID", "AKID"), ("AWS_SECRET_ACCESS_KEY", "s")];
        let t = resolve(&keys, ProviderKind::Bedrock, None).unwrap();
        assert_eq!(t.base_url, "https://bedrock-runtime.eu-west-3.amazonaws.com");
        assert!(matches!(t.cloud, Some(Cloud::Bedrock { region_var: "AWS_DEFAULT_REGION", keys: Some(_), .. })));
        let with = |extra: (&'static str, &'static str)| [keys[0], keys[1], keys[2], extra];
        let t = resolve(&with(("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", "https://vpce.example/")), ProviderKind::Bedrock, None).unwrap();
        assert_eq!(t.base_url, "https://vpce.example");
        let e = resolve(&with(("AWS_REGION", "Not A Region")), ProviderKind::Bedrock, None).unwrap_err();
        assert_eq!(e.to_string(), "AWS_REGION: `Not A Region` is not a region such as us-east-1");
        let e = resolve(&keys, ProviderKind::BedrockConverse, Some("TEAM_BEDROCK_KEY")).unwrap_err();
        assert_eq!(e.var, "TEAM_BEDROCK_KEY", "a profile's key variable is named, not replaced by the access keys");
        let e = resolve(&[("AWS_REGION", "us-east-1")], ProviderKind::Bedrock, None).unwrap_err();
        assert!(e.message.contains("AWS profiles, SSO and instance roles are not read"), "{e}");
        let e = resolve(&with(("AWS_SESSION_TOKEN", "a b")), ProviderKind::Bedrock, None).unwrap_err();
        assert_eq!(e.var, "AWS_SESSION_TOKEN");
    }

    #[test]
    fn vertex_needs_a_key_file_and_reads_project_and_location() {
        let e = resolve(&[], ProviderKind::VertexAi, None).unwrap_err();
        assert_eq!(e.var, "GOOGLE_APPLICATION_CREDENTIALS");
        let e = resolve(&[("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/sa.json")], ProviderKind::VertexAi, None).unwrap_err();
        assert!(e.message.starts_with("`/nonexistent/sa.json`: "), "{e}");
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/vertex/service-account.json");
        let t = resolve(&[("GOOGLE_APPLICATION_CREDENTIALS", file), ("GOOGLE_CLOUD_REGION", "global")], ProviderKind::VertexAi, None).unwrap();
        assert_eq!(t.base_url, "https://aiplatform.googleapis.com");
        let Some(Cloud::Vertex { project, location, .. }) = &t.cloud else { panic!("{t:?}") };
        assert_eq!((project.as_str(), location.as_str()), ("fabric-test-project", "global"));
        let t = resolve(&[("GOOGLE_APPLICATION_CREDENTIALS", file), ("CLOUD_ML_PROJECT_ID", "other-1")], ProviderKind::VertexAi, None).unwrap();
        assert_eq!(t.base_url, "https://us-central1-aiplatform.googleapis.com");
        assert!(matches!(&t.cloud, Some(Cloud::Vertex { project, .. }) if project == "other-1"));
        assert!(!format!("{t:?}").contains("PRIVATE KEY"), "the key stays redacted in Debug");
    }
}
