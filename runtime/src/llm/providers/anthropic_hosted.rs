//! Claude on a cloud's own endpoint, in Anthropic's Messages shape ([`super::anthropic`]), as the
//! anthropic SDK's cloud clients send it for LangChain's packages:
//!
//! - `anthropic_bedrock:` (`ChatAnthropicBedrock`, `AnthropicBedrock`): Bedrock's InvokeModel,
//!   `POST {base}/model/{model}/invoke`, the model in the path and the API version in the body;
//!   SigV4 (`bedrock`) or the Bedrock API key as a bearer token.
//! - `bedrock_mantle_anthropic:` (`ChatAnthropicMantle`, `AnthropicBedrockMantle`): Bedrock's
//!   Mantle endpoint, `POST {base}/v1/messages` with Anthropic's own body and `anthropic-version`
//!   header; SigV4 (`bedrock-mantle`) or the Bedrock API key as a bearer token.
//! - `google_anthropic_vertex:` (`ChatAnthropicVertex`, `AnthropicVertex`): Vertex AI's
//!   `POST {base}/projects/{project}/locations/{location}/publishers/anthropic/models/{model}:rawPredict`,
//!   the model in the path, `anthropic_version: vertex-2023-10-16` in the body; the service
//!   account's OAuth token ([`super::gcp_token`]).
//!
//! The reply is Anthropic's on all three ([`super::anthropic::read_messages`]).

use super::anthropic::{API_VERSION, messages_body, read_messages};
use super::{Auth, CallSpec, Codec, HttpBackend, WireRequest, bearer_headers, nested_error_code};
use crate::llm::cloud::Cloud;
use crate::llm::model::{ProviderKind, ProviderTarget, Tuning};
use crate::llm::{Llm, LlmError, ReplyMeta};
use crate::vocab::AnthropicHost;

/// The body's `anthropic_version` on Bedrock: the Messages version Bedrock documents for the
/// shapes this codec writes (the anthropic SDK 2.14 sends its own newest, `2026-10-21`; kept
/// fixed on purpose, as [`API_VERSION`] is, docs/providers.md).
pub const BEDROCK_VERSION: &str = "bedrock-2023-05-31";
/// The body's `anthropic_version` on Vertex AI (the anthropic SDK's `AnthropicVertex`).
pub const VERTEX_VERSION: &str = "vertex-2023-10-16";
/// The SigV4 signing name of Bedrock's Mantle endpoint.
pub const MANTLE_SERVICE: &str = "bedrock-mantle";

/// The Messages codec on one cloud.
#[derive(Debug, Clone, Copy)]
pub struct Hosted {
    pub host: AnthropicHost,
}

/// The backend for a hosted-Claude target, with its signer or token source.
pub fn backend(client: reqwest::Client, target: ProviderTarget, tuning: Tuning, max_reply_bytes: usize) -> Box<dyn Llm> {
    let host = match target.provider {
        ProviderKind::HostedAnthropic(h) => h,
        _ => AnthropicHost::Bedrock,
    };
    let auth: Option<Box<dyn Auth>> = match &target.cloud {
        Some(Cloud::Bedrock { region, keys: Some(keys), .. }) => Some(Box::new(match host {
            AnthropicHost::Mantle => super::sigv4::SigV4::for_service(keys.clone(), region.clone(), MANTLE_SERVICE),
            _ => super::sigv4::SigV4::new(keys.clone(), region.clone()),
        })),
        Some(Cloud::Vertex { account, .. }) => Some(Box::new(super::gcp_token::TokenSource::new(account.clone()))),
        _ => None,
    };
    let backend = HttpBackend::new(client, Hosted { host }, target, tuning).with_max_reply_bytes(max_reply_bytes);
    match auth {
        Some(auth) => Box::new(backend.with_auth(auth)),
        // The Bedrock API key goes as a bearer token from the codec; a target built by hand may
        // have no credential at all (a local proxy).
        None => Box::new(backend),
    }
}

/// A model id in the InvokeModel path as the anthropic SDK puts it there
/// (`urllib.parse.quote(model, safe=":;")`): every byte but the unreserved ones, `:` and `;`
/// percent-encoded (an ARN's `/` too).
pub fn invoke_segment(model: &str) -> String {
    let mut out = String::with_capacity(model.len());
    for b in model.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':' | b';') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Codec for Hosted {
    fn kind(&self) -> ProviderKind {
        ProviderKind::HostedAnthropic(self.host)
    }

    fn encode(&self, call: &CallSpec<'_>) -> WireRequest {
        let t = call.target;
        // With AWS keys the request is signed later (the signature covers the final body); with
        // the Bedrock API key it goes as a bearer token now.
        let signed = matches!(t.cloud, Some(Cloud::Bedrock { keys: Some(_), .. }));
        let bearer = if signed { Vec::new() } else { bearer_headers(call) };
        match self.host {
            AnthropicHost::Bedrock => {
                let url = format!("{}/model/{}/invoke", t.base_url, invoke_segment(&t.model));
                WireRequest { url, headers: bearer, body: messages_body(call, false, Some(BEDROCK_VERSION)) }
            }
            AnthropicHost::Mantle => {
                let mut headers = vec![("anthropic-version", API_VERSION.to_owned())];
                headers.extend(bearer);
                WireRequest { url: format!("{}/v1/messages", t.base_url), headers, body: messages_body(call, true, None) }
            }
            AnthropicHost::Vertex => {
                let (project, location) = match &t.cloud {
                    Some(Cloud::Vertex { project, location, .. }) => (project.as_str(), location.as_str()),
                    _ => ("-", "-"),
                };
                let url = format!("{}/projects/{project}/locations/{location}/publishers/anthropic/models/{}:rawPredict", t.base_url, t.model);
                WireRequest { url, headers: Vec::new(), body: messages_body(call, false, Some(VERTEX_VERSION)) }
            }
        }
    }

    fn decode(&self, body: &[u8], call: &CallSpec<'_>) -> Result<(String, ReplyMeta), LlmError> {
        read_messages(self.kind(), body, call)
    }

    fn error_code(&self, body: &[u8]) -> Option<String> {
        nested_error_code(body)
    }

    fn header_error_code(&self, headers: &reqwest::header::HeaderMap) -> Option<String> {
        // InvokeModel names its error in `x-amzn-ErrorType`, as Converse does.
        headers.get("x-amzn-errortype").and_then(|v| v.to_str().ok()).and_then(super::bedrock::error_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_goes_into_the_invoke_path_as_the_sdk_quotes_it() {
        assert_eq!(invoke_segment("anthropic.claude-3-5-haiku-20241022-v1:0"), "anthropic.claude-3-5-haiku-20241022-v1:0");
        assert_eq!(invoke_segment("arn:aws:bedrock:us-east-1:1:inference-profile/us.x"), "arn:aws:bedrock:us-east-1:1:inference-profile%2Fus.x");
        assert_eq!(invoke_segment("a b"), "a%20b");
    }
}
