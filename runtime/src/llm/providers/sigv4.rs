//! AWS Signature Version 4 for Bedrock requests, by the AWS SDK for Rust's own signer
//! (`aws-sigv4`): the request's method, URL, signed headers and body hash, under the keys'
//! secret, for the region and the service `bedrock` (the signing name of `bedrock-runtime`).
//!
//! The signature covers the exact body bytes sent, so the executor signs after serialising.
//! Nothing of the keys leaves this module but the `Authorization` header itself (and the session
//! token in `x-amz-security-token`, as AWS requires).

use std::time::SystemTime;

use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
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

    /// The headers that sign `POST url` with `headers` and `body` at `time`: `authorization`,
    /// `x-amz-date`, and `x-amz-security-token` with a session token.
    pub fn sign(&self, url: &str, headers: &[(&str, &str)], body: &[u8], time: SystemTime) -> Result<Vec<(&'static str, String)>, LlmError> {
        let credentials = aws_credential_types::Credentials::new(
            self.keys.access_key_id.expose(),
            self.keys.secret_access_key.expose(),
            self.keys.session_token.as_ref().map(|t| t.expose().to_owned()),
            None,
            "environment",
        );
        let identity = credentials.into();
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

impl Auth for SigV4 {
    fn headers<'a>(&'a self, _client: &'a reqwest::Client, url: &'a str, body: &'a [u8]) -> BoxFuture<'a, AuthHeaders> {
        // The signed headers: `host` (from the URL) and `content-type`, as botocore signs them.
        let signed = self.sign(url, &[("content-type", "application/json")], body, SystemTime::now());
        Box::pin(std::future::ready(signed))
    }
}
