//! A cloud's access token, cached until shortly before it expires and forgotten on a 401:
//! Vertex AI's (a service account's RS256-signed JWT exchanged for an OAuth 2.0 token at the key
//! file's `token_uri`, RFC 7523's JWT bearer grant, as google-auth does it for a scoped service
//! account) and IBM watsonx.ai's (an IBM Cloud API key exchanged at IBM's IAM endpoint, as the
//! ibm-watsonx-ai SDK does it).
//!
//! One exchange at a time: concurrent calls that find no fresh token wait for the one exchange
//! under way instead of each starting one. Nothing of the key, the JWT or the token reaches an
//! error: messages name the token endpoint by origin and the endpoint's error code only.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};

use super::{Auth, AuthHeaders};
use crate::llm::cloud::ServiceAccount;
use crate::llm::model::ApiKey;
use crate::llm::{BoxFuture, LlmError, ReasonClass};

/// The scope Vertex AI calls need (ChatVertexAI's default scope).
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// A token is renewed this long before its end (google-auth's refresh threshold), so that it
/// does not expire on the way.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(225);
/// The longest lifetime believed: Google's tokens last an hour; a longer `expires_in` from the
/// endpoint (or a hostile one) is read as this.
pub const MAX_LIFETIME: Duration = Duration::from_secs(3600);
/// How long the token endpoint may take.
pub const TOKEN_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest token reply read (a real one is under 2 KiB).
const MAX_TOKEN_REPLY: usize = 64 * 1024;

/// The access token of one service account or API key.
pub struct TokenSource {
    grant: Grant,
    cache: tokio::sync::Mutex<Option<(ApiKey, Instant)>>,
    timeout: Duration,
}

/// What is exchanged for a token, and where.
enum Grant {
    /// A Google service account; `key` is `None` when the file's PEM holds no RSA key (each call
    /// then fails saying so).
    Google { key: Option<EncodingKey>, account: ServiceAccount },
    /// An IBM Cloud API key, at `{iam}/identity/token`; `var` names where it came from.
    IbmApiKey { api_key: ApiKey, var: String, token_url: String },
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.grant {
            Grant::Google { account, .. } => f.debug_struct("TokenSource").field("account", account).finish_non_exhaustive(),
            Grant::IbmApiKey { var, token_url, .. } => {
                f.debug_struct("TokenSource").field("api_key_var", var).field("token_url", token_url).finish_non_exhaustive()
            }
        }
    }
}

/// The IBM Cloud IAM grant type of an API key (ibm-watsonx-ai's `IAMTokenAuth`).
pub const IBM_GRANT: &str = "urn:ibm:params:oauth:grant-type:apikey";
/// The fixed client credentials IBM's IAM expects from its SDKs (`bx:bx`, base64).
const IBM_CLIENT: &str = "Basic Yng6Yng=";

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

#[derive(Deserialize)]
struct TokenReply {
    access_token: String,
    expires_in: Option<f64>,
}

#[derive(Deserialize)]
struct TokenError {
    error: Option<String>,
}

impl TokenSource {
    pub fn new(account: ServiceAccount) -> TokenSource {
        // Configuration already refused such a file at start; this is the library used without it.
        let key = EncodingKey::from_rsa_pem(account.private_key.expose().as_bytes()).ok();
        TokenSource { grant: Grant::Google { key, account }, cache: tokio::sync::Mutex::new(None), timeout: TOKEN_TIMEOUT }
    }

    /// The token of an IBM Cloud API key (from the variable `var`), at `token_url`.
    pub fn ibm(api_key: ApiKey, var: String, token_url: String) -> TokenSource {
        TokenSource { grant: Grant::IbmApiKey { api_key, var, token_url }, cache: tokio::sync::Mutex::new(None), timeout: TOKEN_TIMEOUT }
    }

    /// Overrides how long the token endpoint may take (tests).
    pub fn with_timeout(mut self, timeout: Duration) -> TokenSource {
        self.timeout = timeout;
        self
    }

    /// The signed JWT of the grant, issued at `now`.
    pub fn assertion(&self, now: SystemTime) -> Result<String, LlmError> {
        let Grant::Google { key, account } = &self.grant else {
            return Err(LlmError::new(ReasonClass::ClientError, "an IBM Cloud API key signs no JWT"));
        };
        let key = key.as_ref().ok_or_else(|| LlmError::new(ReasonClass::ClientError, format!("the private_key of {} is not an RSA key", account.path)))?;
        let iat = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let claims = Claims { iss: &account.client_email, scope: SCOPE, aud: &account.token_uri, iat, exp: iat + 3600 };
        let mut header = Header::new(Algorithm::RS256);
        header.kid.clone_from(&account.private_key_id);
        jsonwebtoken::encode(&header, &claims, key).map_err(|_| LlmError::new(ReasonClass::ClientError, "cannot sign the service account's JWT"))
    }

    /// A fresh token: the cached one, or a new one from the token endpoint.
    pub async fn token(&self, client: &reqwest::Client) -> Result<ApiKey, LlmError> {
        let mut cache = self.cache.lock().await;
        if let Some((token, renew_at)) = cache.as_ref()
            && Instant::now() < *renew_at
        {
            return Ok(token.clone());
        }
        let (token, lifetime) = self.exchange(client).await?;
        // A token too short-lived to keep is used for this call only.
        *cache = lifetime.checked_sub(REFRESH_MARGIN).map(|keep| (token.clone(), Instant::now() + keep));
        Ok(token)
    }

    async fn exchange(&self, client: &reqwest::Client) -> Result<(ApiKey, Duration), LlmError> {
        let shown = crate::redact::origin_and_path;
        let (endpoint, whose) = match &self.grant {
            Grant::Google { account, .. } => {
                (account.token_uri.as_str(), format!("Vertex AI token endpoint {} (token_uri of {})", shown(&account.token_uri), account.path))
            }
            Grant::IbmApiKey { var, token_url, .. } => {
                (token_url.as_str(), format!("IBM Cloud IAM endpoint {} (for the API key from {var})", shown(token_url)))
            }
        };
        let failed = |class, what: String| LlmError::new(class, format!("{whose}: {what}"));
        // The serializer is dropped before the await (it is not Send).
        let form = {
            let mut form = url::form_urlencoded::Serializer::new(String::new());
            match &self.grant {
                Grant::Google { .. } => {
                    let assertion = self.assertion(SystemTime::now())?;
                    form.append_pair("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer").append_pair("assertion", &assertion).finish()
                }
                // As ibm-watsonx-ai sends it: the key first, then the grant type.
                Grant::IbmApiKey { api_key, .. } => form.append_pair("apikey", api_key.expose()).append_pair("grant_type", IBM_GRANT).finish(),
            }
        };
        let waited = format!("no answer within {} s", self.timeout.as_secs_f64());
        let mut request = client.post(endpoint).timeout(self.timeout).header("content-type", "application/x-www-form-urlencoded");
        if matches!(self.grant, Grant::IbmApiKey { .. }) {
            request = request.header("authorization", IBM_CLIENT);
        }
        let sent = request.body(form).send().await.map_err(|e| {
            let class = if e.is_timeout() { ReasonClass::Timeout } else { ReasonClass::Connection };
            failed(class, if e.is_timeout() { waited.clone() } else { "cannot connect".into() })
        });
        let mut response = sent?;
        let status = response.status().as_u16();
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) if body.len() + chunk.len() <= MAX_TOKEN_REPLY => body.extend_from_slice(&chunk),
                Ok(Some(_)) => return Err(failed(ReasonClass::ProviderError, format!("the reply is larger than {MAX_TOKEN_REPLY} bytes"))),
                Ok(None) => break,
                Err(e) if e.is_timeout() => return Err(failed(ReasonClass::Timeout, waited)),
                Err(_) => return Err(failed(ReasonClass::Connection, "the connection broke during the reply".into())),
            }
        }
        if !(200..300).contains(&status) {
            // OAuth's `error` is a short code (`invalid_grant`); its description may quote the
            // assertion, and is not kept.
            let code = serde_json::from_slice::<TokenError>(&body).ok().and_then(|e| e.error).filter(|c| super::is_code(c));
            let code = code.map_or(String::new(), |c| format!(" ({c})"));
            let class = if (300..400).contains(&status) { ReasonClass::ProviderError } else { super::status_class(status) };
            return Err(failed(class, format!("HTTP {status}{code}")));
        }
        let reply: TokenReply = serde_json::from_slice(&body)
            .map_err(|e| failed(ReasonClass::ProviderError, format!("the reply is not an OAuth token (JSON line {} column {})", e.line(), e.column())))?;
        if reply.access_token.is_empty() || super::super::model::check_key("access_token", &reply.access_token).is_err() {
            return Err(failed(ReasonClass::ProviderError, "the reply's access_token is empty or cannot be sent in a header".into()));
        }
        Ok((ApiKey::new(reply.access_token), lifetime(reply.expires_in)))
    }
}

/// `expires_in` read safely: absent, negative or not finite is 0 (the token is used once);
/// anything past [`MAX_LIFETIME`] is [`MAX_LIFETIME`].
pub fn lifetime(expires_in: Option<f64>) -> Duration {
    match expires_in {
        Some(s) if s.is_finite() && s > 0.0 => Duration::try_from_secs_f64(s).map_or(MAX_LIFETIME, |d| d.min(MAX_LIFETIME)),
        _ => Duration::ZERO,
    }
}

impl Auth for TokenSource {
    fn headers<'a>(&'a self, client: &'a reqwest::Client, _url: &'a str, _body: &'a [u8]) -> BoxFuture<'a, AuthHeaders> {
        Box::pin(async move { Ok(vec![("authorization", format!("Bearer {}", self.token(client).await?.expose()))]) })
    }

    fn refused(&self) -> bool {
        // `try_lock`: a call holding the lock is fetching a new token right now, which is what
        // forgetting would cause anyway.
        match self.cache.try_lock() {
            Ok(mut cache) => cache.take().is_some(),
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_expires_in_is_bounded() {
        assert_eq!(lifetime(Some(3599.0)), Duration::from_secs(3599));
        assert_eq!(lifetime(Some(1e300)), MAX_LIFETIME);
        assert_eq!(lifetime(Some(f64::INFINITY)), Duration::ZERO);
        assert_eq!(lifetime(Some(-5.0)), Duration::ZERO);
        assert_eq!(lifetime(Some(f64::NAN)), Duration::ZERO);
        assert_eq!(lifetime(None), Duration::ZERO);
    }
}
