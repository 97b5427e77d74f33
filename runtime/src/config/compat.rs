//! Where the OpenAI-compatible family, Azure OpenAI and Mistral are, read as each provider's
//! LangChain package reads it (the table is `llm::providers::compat::endpoint`).

use super::Settings;
use crate::llm::providers::compat::endpoint;
use crate::vocab::{Compat, ConfigError, err, parse_base_url};

/// The runtime's own base-URL override, read after the package's own variables.
pub const FABRIC_LLM_BASE_URL: &str = "FABRIC_LLM_BASE_URL";
/// langchain-core's LangSmith gateway (`_LANGSMITH_GATEWAY_DEFAULT_BASE`).
pub const LANGSMITH_GATEWAY: &str = "https://gateway.smith.langchain.com";

impl Settings {
    /// The base URL of a family member and whether it is the public default (which needs a
    /// key): a model profile's `base_url`, else the package's variables in its order, else
    /// `FABRIC_LLM_BASE_URL`, else the package's default.
    pub(super) fn compat_base_url(&self, c: Compat, model: &str, profile: Option<&str>) -> Result<(String, bool), ConfigError> {
        if let Some(u) = profile {
            return Ok((parse_base_url("model profile base_url", u)?, false));
        }
        if c == Compat::LangSmith
            && let Some(g) = self.var("LANGSMITH_GATEWAY").map(str::trim)
        {
            // langchain-core's gateway switch: a truthy word means LangChain's gateway, a URL a
            // gateway of one's own; the provider path (/v1) is appended either way.
            match g.to_ascii_lowercase().as_str() {
                "false" | "0" | "no" | "off" => {}
                "true" | "1" | "yes" | "on" => return Ok((LANGSMITH_GATEWAY.to_owned() + "/v1", true)),
                _ => return Ok((parse_base_url("LANGSMITH_GATEWAY", g)? + "/v1", false)),
            }
        }
        let e = endpoint(c);
        for var in e.base_url_vars.iter().copied().chain([FABRIC_LLM_BASE_URL]) {
            if let Some(u) = self.var(var) {
                let url = parse_base_url(var, u)?;
                // langchain-azure-ai appends /openai/v1 to the resource's AZURE_OPENAI_ENDPOINT
                // (AZURE_AI_OPENAI_ENDPOINT is taken verbatim).
                let url = if c == Compat::AzureAi && var == "AZURE_OPENAI_ENDPOINT" { format!("{url}/openai/v1") } else { url };
                return Ok((url, false));
            }
        }
        if c == Compat::MantleOpenAi {
            // ChatOpenAIMantle's endpoint is per region: /openai/v1 for OpenAI's GPT models (the
            // Responses API), /v1 for the open-weight ones.
            let var = |v: &str| self.var(v).map(str::to_owned);
            let (region_var, value) = super::cloud::first(&var, &["AWS_REGION", "AWS_DEFAULT_REGION"]).ok_or_else(|| {
                err(
                    "AWS_REGION or AWS_DEFAULT_REGION",
                    "is required for provider bedrock_mantle_openai (its endpoint is per region), or set FABRIC_LLM_BASE_URL",
                )
            })?;
            let region = super::cloud::region(region_var, &value)?;
            let path = if crate::llm::providers::compat::mantle_responses(model) { "openai/v1" } else { "v1" };
            return Ok((format!("https://bedrock-mantle.{region}.api.aws/{path}"), true));
        }
        match e.default_base_url {
            Some(u) => Ok((u.to_owned(), true)),
            None => {
                let vars: Vec<&str> = e.base_url_vars.iter().copied().chain([FABRIC_LLM_BASE_URL]).collect();
                Err(err(&vars.join(" or "), format!("is required for provider {}: it has no public endpoint (the address of your {})", c.key(), what(c))))
            }
        }
    }

    /// `OPENAI_API_VERSION`, which AzureChatOpenAI requires (it has no default), and the
    /// deployment name, which goes into the URL's path.
    pub(super) fn azure_api_version(&self, deployment: &str) -> Result<String, ConfigError> {
        if !deployment.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
            return Err(err("FABRIC_LLM_MODEL", format!("`{deployment}` is not an Azure OpenAI deployment name (letters, digits, `-`, `_`, `.`)")));
        }
        let v = self
            .var("OPENAI_API_VERSION")
            .map(str::trim)
            .ok_or_else(|| err("OPENAI_API_VERSION", "is required for provider azure_openai (as AzureChatOpenAI requires it), e.g. 2024-10-21"))?;
        if v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            Ok(v.to_owned())
        } else {
            Err(err("OPENAI_API_VERSION", format!("`{v}` is not an API version such as 2024-10-21")))
        }
    }
}

fn what(c: Compat) -> &'static str {
    match c {
        Compat::LiteLlm => "LiteLLM proxy",
        Compat::AzureAi => "Azure AI Foundry resource, …/openai/v1",
        _ => "Azure OpenAI resource",
    }
}

impl Settings {
    /// `bedrock_mantle_openai:` with AWS keys instead of a Bedrock API key: the region (the keys'
    /// scope) and the keys, from which the backend makes short-term Bedrock API keys.
    pub(super) fn mantle_with_aws_keys(
        &self,
        model: String,
        base_url: String,
        var: &dyn Fn(&str) -> Option<String>,
    ) -> Result<crate::config::ProviderTarget, ConfigError> {
        use crate::llm::cloud::Cloud;
        use crate::vocab::ProviderKind;
        let kind = ProviderKind::Compat(Compat::MantleOpenAi);
        let (region_var, value) = super::cloud::first(var, &["AWS_REGION", "AWS_DEFAULT_REGION"]).ok_or_else(|| {
            err("AWS_REGION or AWS_DEFAULT_REGION", "is required for provider bedrock_mantle_openai with AWS keys (the short-term API keys are per region)")
        })?;
        let region = super::cloud::region(region_var, &value)?;
        let keys = super::cloud::aws_keys(var, kind, &model)?;
        Ok(crate::config::ProviderTarget {
            provider: kind,
            model,
            base_url,
            api_key: None,
            api_key_var: None,
            api_version: String::new(),
            cloud: Some(Cloud::Bedrock { region, region_var, keys: Some(keys) }),
        })
    }
}
