//! Where a cloud provider's calls go and how they authenticate: Amazon Bedrock (a region, and
//! AWS keys for Signature Version 4 or a Bedrock API key) and Vertex AI (a project, a location,
//! and a Google service account). [`crate::config`] resolves them from the environment as the
//! reference's packages do; the backends in [`crate::llm::providers`] use them.
//!
//! Every secret is an [`ApiKey`]: it reaches its provider (or token endpoint) and nothing else.

use std::fmt;

use serde::Deserialize;

use crate::llm::model::ApiKey;

/// What a cloud provider's target needs besides a base URL and a model.
#[derive(Debug, Clone, PartialEq)]
pub enum Cloud {
    /// Amazon Bedrock (`bedrock_converse:`, `bedrock:`).
    Bedrock {
        region: String,
        /// Where the region came from (`AWS_REGION`, `AWS_DEFAULT_REGION`).
        region_var: &'static str,
        /// The keys a request is signed with; `None` when the target's `api_key` (the Bedrock
        /// API key, `AWS_BEARER_TOKEN_BEDROCK`) goes as a bearer token instead.
        keys: Option<AwsKeys>,
    },
    /// Vertex AI (`google_vertexai:`).
    Vertex {
        project: String,
        /// Where the project came from (a variable, or the credentials file's `project_id`).
        project_from: String,
        location: String,
        /// Where the location came from (a variable, or the default).
        location_from: String,
        account: ServiceAccount,
    },
    /// IBM watsonx.ai (`ibm:`).
    Watsonx {
        /// The project or deployment space the calls run in.
        scope: WatsonxScope,
        /// Where it came from (`WATSONX_PROJECT_ID`, `WATSONX_SPACE_ID`).
        scope_var: &'static str,
        /// The IBM Cloud API key exchanged for IAM tokens, and the IAM token endpoint; `None` when
        /// the target's `api_key` is a token already (`WATSONX_TOKEN`), sent as it is.
        iam: Option<IamKey>,
    },
}

/// The watsonx.ai project or deployment space of a call (its `project_id` or `space_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatsonxScope {
    Project(String),
    Space(String),
}

/// An IBM Cloud API key and where it is exchanged.
#[derive(Debug, Clone, PartialEq)]
pub struct IamKey {
    pub api_key: ApiKey,
    /// The variable it came from (`WATSONX_API_KEY`, `WATSONX_APIKEY`).
    pub var: String,
    /// `{iam}/identity/token`.
    pub token_url: String,
}

/// AWS access keys, read from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and the optional
/// `AWS_SESSION_TOKEN`, as boto3's environment provider reads them.
#[derive(Clone, PartialEq, Eq)]
pub struct AwsKeys {
    /// Not secret on its own (it names the key, as the `Credential=` of every signed request
    /// does), but never shown either: `doctor` says where the keys came from, not what they are.
    pub access_key_id: ApiKey,
    pub secret_access_key: ApiKey,
    pub session_token: Option<ApiKey>,
}

impl fmt::Debug for AwsKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsKeys").field("session_token", &self.session_token.is_some()).finish_non_exhaustive()
    }
}

impl AwsKeys {
    /// Where the keys came from, for `doctor` and messages.
    pub fn source(&self) -> &'static str {
        if self.session_token.is_some() {
            "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN"
        } else {
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        }
    }
}

/// A Google service account from its JSON key file (`GOOGLE_APPLICATION_CREDENTIALS`): what the
/// OAuth 2.0 JWT grant needs. Read once at start; the key stays redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct ServiceAccount {
    /// The file it was read from (shown by `doctor`; it names no secret).
    pub path: String,
    /// The account (the JWT's issuer; an identity, not a secret).
    pub client_email: String,
    /// The key's id (the JWT's `kid`).
    pub private_key_id: Option<String>,
    /// The RSA private key, PEM.
    pub private_key: ApiKey,
    /// Where the JWT is exchanged for an access token (tests point it at a local server).
    pub token_uri: String,
    pub project_id: Option<String>,
}

impl fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceAccount").field("path", &self.path).field("client_email", &self.client_email).finish_non_exhaustive()
    }
}

/// What is wrong with a service-account file. Its message never quotes the file's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AccountError(String);

/// The key file as Google writes it; only what the JWT grant needs is read.
#[derive(Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key_id: Option<String>,
    private_key: Option<String>,
    token_uri: Option<String>,
    project_id: Option<String>,
}

/// Google's token endpoint, for a key file without `token_uri` (google-auth's default).
pub const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

impl ServiceAccount {
    /// Reads a service-account key file's text. Errors name the field, never a value.
    pub fn parse(path: &str, text: &str) -> Result<ServiceAccount, AccountError> {
        // serde_json's message may quote a fragment of the file (the key): only its position.
        let file: KeyFile = serde_json::from_str(text)
            .map_err(|e| AccountError(format!("is not a service-account key file (JSON, line {} column {})", e.line(), e.column())))?;
        match file.kind.as_deref() {
            Some("service_account") => {}
            Some(other) if other.len() <= 40 && other.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => {
                return Err(AccountError(format!("has type `{other}`; only a service account's key file (type `service_account`) is supported")));
            }
            _ => return Err(AccountError("has no `type: service_account`; only a service account's key file is supported".into())),
        }
        let need = |v: Option<String>, field: &str| v.filter(|s| !s.trim().is_empty()).ok_or_else(|| AccountError(format!("has no `{field}`")));
        let client_email = need(file.client_email, "client_email")?;
        let private_key = need(file.private_key, "private_key")?;
        // Checked here, at start, rather than on the first call.
        if jsonwebtoken::EncodingKey::from_rsa_pem(private_key.as_bytes()).is_err() {
            return Err(AccountError("`private_key` is not a PEM RSA private key".into()));
        }
        let token_uri = file.token_uri.filter(|s| !s.trim().is_empty()).unwrap_or_else(|| GOOGLE_TOKEN_URI.to_owned());
        match reqwest::Url::parse(&token_uri) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {}
            _ => return Err(AccountError(format!("`token_uri` `{}` is not an http(s) URL", crate::redact::redact_url(&token_uri)))),
        }
        Ok(ServiceAccount {
            path: path.to_owned(),
            client_email,
            private_key_id: file.private_key_id.filter(|s| !s.is_empty()),
            private_key: ApiKey::new(private_key),
            token_uri,
            project_id: file.project_id.filter(|s| !s.trim().is_empty()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_key_file_is_named_without_its_content() {
        let e = ServiceAccount::parse("f", r#"{"type": "service_account", "private_key": "sk-secret"#).unwrap_err();
        assert!(e.0.contains("line 1") && !e.0.contains("sk-secret"), "{e}");
        let e = ServiceAccount::parse("f", r#"{"type": "authorized_user", "refresh_token": "sk-secret"}"#).unwrap_err();
        assert!(e.0.contains("authorized_user") && !e.0.contains("sk-secret"), "{e}");
        let e = ServiceAccount::parse("f", r#"{"type": "service_account", "client_email": "a@b", "private_key": "sk-secret"}"#).unwrap_err();
        assert!(e.0.contains("PEM") && !e.0.contains("sk-secret"), "{e}");
        let e = ServiceAccount::parse("f", r#"{"type": "service_account", "private_key": "x"}"#).unwrap_err();
        assert_eq!(e.0, "has no `client_email`");
    }

    #[test]
    fn the_test_key_file_reads_and_its_key_stays_redacted() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/vertex/service-account.json");
        let a = ServiceAccount::parse(path, &std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(a.project_id.as_deref(), Some("fabric-test-project"));
        assert!(!format!("{a:?}").contains("PRIVATE"));
    }
}
