//! AWS Signature Version 4 for Bedrock requests, by the AWS SDK for Rust's own signer
//! (`aws-sigv4`): the request's method, URL, signed headers and body hash, under the keys'
//! secret, for the region and the service `bedrock` (the signing name of `bedrock-runtime`).
//!
//! The signature covers the exact body bytes sent, so the executor signs after serialising.
//! Nothing of the keys leaves this module but the `Authorization` header itself (and the session
//! token in `x-amz-security-token`, as AWS requires).

use std::time::SystemTime;

use aws_sigv4::http_request::{SignableBody, SignableRequest, SignatureLocation, SigningSettings, sign};
use aws_sigv4::sign::v4;

use super::{Auth, AuthHeaders};
use crate::llm::cloud::AwsKeys;
use crate::llm::{BoxFuture, LlmError, ReasonClass};

/// The signing name of the Bedrock runtime endpoints (botocore's `signingName`).
pub const SERVICE: &str = "bedrock";

/// Signs every request with one set of keys, for one region.
#[derive(Debug)]
pub struct SigV4 {
    keys: AwsKeys,
    region: String,
    service: &'static str,
}

impl SigV4 {
    pub fn new(keys: AwsKeys, region: String) -> SigV4 {
        SigV4 { keys, region, service: SERVICE }
    }

    /// Signs for another signing name: `bedrock-mantle`, Bedrock's Mantle endpoint (the
    /// anthropic SDK's `AnthropicBedrockMantle`).
    pub fn for_service(keys: AwsKeys, region: String, service: &'static str) -> SigV4 {
        SigV4 { keys, region, service }
    }

    /// The keys as the AWS SDK holds them (the signer takes them as its identity).
    fn credentials(&self) -> aws_credential_types::Credentials {
        aws_credential_types::Credentials::new(
            self.keys.access_key_id.expose(),
            self.keys.secret_access_key.expose(),
            self.keys.session_token.as_ref().map(|t| t.expose().to_owned()),
            None,
            "environment",
        )
    }

    /// The headers that sign `POST url` with `headers` and `body` at `time`: `authorization`,
    /// `x-amz-date`, and `x-amz-security-token` with a session token.
    pub fn sign(&self, url: &str, headers: &[(&str, &str)], body: &[u8], time: SystemTime) -> Result<Vec<(&'static str, String)>, LlmError> {
        let identity = self.credentials().into();
        // The signer's errors name what was wrong with the request's shape, never a key; they
        // are still reduced to a fixed text, as they cannot happen with the URLs built here.
        let failed = |what: &str| LlmError::new(ReasonClass::ClientError, format!("cannot sign the Bedrock request (AWS Signature Version 4): {what}"));
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(self.service)
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .map_err(|_| failed("incomplete signing parameters"))?
            .into();
        let request = SignableRequest::new("POST", url, headers.iter().copied(), SignableBody::Bytes(body)).map_err(|_| failed("the URL or a header"))?;
        let (instructions, _signature) = sign(request, &params).map_err(|_| failed("the signer refused the request"))?.into_parts();
        let (signed, _query) = instructions.into_parts();
        Ok(signed.into_iter().map(|h| (h.name(), h.value().to_owned())).collect())
    }
}

/// Where a short-term Bedrock API key points: the presigned `CallWithBearerToken` action.
const TOKEN_URL: &str = "https://bedrock.amazonaws.com/?Action=CallWithBearerToken";

impl SigV4 {
    /// A short-term Bedrock API key, as aws-bedrock-token-generator makes one (what
    /// ChatOpenAIMantle sends without `AWS_BEARER_TOKEN_BEDROCK`): `bedrock-api-key-` and the
    /// base64 of a presigned `POST https://bedrock.amazonaws.com/?Action=CallWithBearerToken`
    /// (scheme dropped, `&Version=1` appended), signed at `time`, valid for `expires`.
    pub fn bedrock_api_key(&self, time: SystemTime, expires: std::time::Duration) -> Result<String, LlmError> {
        let identity = self.credentials().into();
        let failed =
            |what: &str| LlmError::new(ReasonClass::ClientError, format!("cannot make a short-term Bedrock API key (AWS Signature Version 4): {what}"));
        let mut settings = SigningSettings::default();
        settings.signature_location = SignatureLocation::QueryParams;
        settings.expires_in = Some(expires);
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(SERVICE)
            .time(time)
            .settings(settings)
            .build()
            .map_err(|_| failed("incomplete signing parameters"))?
            .into();
        // botocore's SigV4QueryAuth hashes the (empty) body, as its header signing does.
        let request = SignableRequest::new("POST", TOKEN_URL, std::iter::empty(), SignableBody::Bytes(&[])).map_err(|_| failed("the URL"))?;
        let (instructions, _signature) = sign(request, &params).map_err(|_| failed("the signer refused the request"))?.into_parts();
        let (_headers, query) = instructions.into_parts();
        // In botocore's order (the auth parameters as it adds them, the signature last), each
        // value encoded as SigV4 encodes it.
        const ORDER: [&str; 7] =
            ["X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Security-Token", "X-Amz-Signature"];
        let mut url = TOKEN_URL.trim_start_matches("https://").to_owned();
        for name in ORDER {
            if let Some((_, value)) = query.iter().find(|(n, _)| *n == name) {
                url.push_str(&format!("&{name}={}", super::bedrock::path_segment(value)));
            }
        }
        url.push_str("&Version=1");
        use base64::Engine as _;
        Ok(format!("bedrock-api-key-{}", base64::engine::general_purpose::STANDARD.encode(url)))
    }
}

impl Auth for SigV4 {
    fn headers<'a>(&'a self, _client: &'a reqwest::Client, url: &'a str, body: &'a [u8]) -> BoxFuture<'a, AuthHeaders> {
        // The signed headers: `host` (from the URL) and `content-type`, as botocore signs them.
        let signed = self.sign(url, &[("content-type", "application/json")], body, SystemTime::now());
        Box::pin(std::future::ready(signed))
    }
}

/// How long a short-term Bedrock API key is asked for: 12 hours, Bedrock's most (and langchain-aws's
/// default for ChatOpenAIMantle).
pub const API_KEY_LIFETIME: std::time::Duration = std::time::Duration::from_secs(43_200);
/// A short-term key is made anew this long before it ends (langchain-aws's advisory refresh).
pub const API_KEY_MARGIN: std::time::Duration = std::time::Duration::from_secs(900);

/// Short-term Bedrock API keys made from AWS keys, each kept until [`API_KEY_MARGIN`] before it
/// ends, sent as a bearer token (`bedrock_mantle_openai:` without `AWS_BEARER_TOKEN_BEDROCK`, as
/// ChatOpenAIMantle's `_BedrockApiKeyProvider` does). Made locally: no call to make.
#[derive(Debug)]
pub struct BedrockKeys {
    signer: SigV4,
    cache: std::sync::Mutex<Option<(crate::llm::model::ApiKey, std::time::Instant)>>,
}

impl BedrockKeys {
    pub fn new(keys: AwsKeys, region: String) -> BedrockKeys {
        BedrockKeys { signer: SigV4::new(keys, region), cache: std::sync::Mutex::new(None) }
    }

    fn key(&self) -> Result<crate::llm::model::ApiKey, LlmError> {
        let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((key, renew_at)) = cache.as_ref()
            && std::time::Instant::now() < *renew_at
        {
            return Ok(key.clone());
        }
        let key = crate::llm::model::ApiKey::new(self.signer.bedrock_api_key(SystemTime::now(), API_KEY_LIFETIME)?);
        *cache = Some((key.clone(), std::time::Instant::now() + (API_KEY_LIFETIME - API_KEY_MARGIN)));
        Ok(key)
    }
}

impl Auth for BedrockKeys {
    fn headers<'a>(&'a self, _client: &'a reqwest::Client, _url: &'a str, _body: &'a [u8]) -> BoxFuture<'a, AuthHeaders> {
        let headers = self.key().map(|k| vec![("authorization", format!("Bearer {}", k.expose()))]);
        Box::pin(std::future::ready(headers))
    }

    fn refused(&self) -> bool {
        // A key refused early (its keys rotated): a new one, and the call once more.
        self.cache.lock().map(|mut c| c.take().is_some()).unwrap_or(false)
    }
}
