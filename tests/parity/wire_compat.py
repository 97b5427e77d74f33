"""The OpenAI-compatible family, Azure OpenAI and Mistral in the wire fixtures (issue #30).

Imported by gen_wire_fixtures.py once its venv runs. Each of these providers' LangChain package
speaks OpenAI's Chat Completions shape (or, for Mistral, its own near-copy of it), but each with
its own defaults: the path, extra headers and body fields, `max_tokens` or
`max_completion_tokens`, and the structured-output method `with_structured_output` picks by
default (a forced tool for most; `json_schema` for a few). The table below says, per provider,
the model of the fixture, the keyword arguments and environment that point the package at the
capture server, and that method, which decides how the canned replies answer: with a tool call
when the package asked for one, as message content otherwise. `generate` asserts that the
package really asked for what the table says, so the table cannot drift from the package.

`init_chat_model` gets what the Python runtime passes (temperature, max_tokens, timeout,
base_url, api_key) except where a package names them differently; each override says why.
"""

import json

from gen_wire_fixtures import API_KEY, THOUGHT, USAGE_IN, USAGE_OUT, answer_for, content_for

# provider -> (model, structured method, kwargs over the Python runtime's, environment, packages
# recorded). "URL" in a value is the capture server's base URL.
PROVIDERS = {
    "deepseek": ("deepseek-chat", "function_calling", {}, {}, ["langchain-deepseek"]),
    # The groq SDK appends /openai/v1 to its base URL, as it does to https://api.groq.com.
    "groq": ("llama-3.3-70b-versatile", "function_calling", {}, {}, ["langchain-groq", "groq"]),
    "xai": ("grok-4", "function_calling", {}, {}, ["langchain-xai"]),
    # The fireworks SDK appends /v1/chat/completions to an overridden base URL.
    "fireworks": ("accounts/fireworks/models/llama-v3p3-70b-instruct", "function_calling", {}, {}, ["langchain-fireworks", "fireworks-ai"]),
    "together": ("meta-llama/Llama-3.3-70B-Instruct-Turbo", "function_calling", {}, {}, ["langchain-together"]),
    "openrouter": ("openai/gpt-4o-mini", "function_calling", {}, {}, ["langchain-openrouter", "openrouter"]),
    # ChatPerplexity passes an unknown `base_url` on to every request (the SDK refuses it); its
    # client reads PERPLEXITY_BASE_URL.
    "perplexity": ("sonar", "json_schema", {"base_url": None}, {"PERPLEXITY_BASE_URL": "URL"}, ["langchain-perplexity", "perplexityai"]),
    # NVIDIA's base URL ends in /v1 (https://integrate.api.nvidia.com/v1); the package lists the
    # models (GET {base}/models) before a structured call, which the capture server answers.
    # Its usage telemetry (on by default, posted to NVIDIA) is off: nothing leaves loopback.
    "nvidia": ("meta/llama-3.1-8b-instruct", "json_schema", {"base_url": "URL/v1", "usage_telemetry_enabled": False}, {},
               ["langchain-nvidia-ai-endpoints"]),
    "upstage": ("solar-pro2", "function_calling", {}, {}, ["langchain-upstage"]),
    "baseten": ("deepseek-ai/DeepSeek-V3.1", "function_calling", {}, {}, ["langchain-baseten"]),
    # ChatLiteLLM calls the litellm library, which takes the proxy's URL as `api_base`.
    "litellm": ("gpt-4o-mini", "json_schema", {"base_url": None, "api_base": "URL"}, {}, ["langchain-litellm", "litellm"]),
    # Foundry's OpenAI-compatible endpoint (`.../openai/v1`) and a key as `credential`.
    "azure_ai": ("gpt-4o-mini", "json_schema", {"base_url": None, "api_key": None, "endpoint": "URL", "credential": API_KEY}, {},
                 ["langchain-azure-ai"]),
    # AzureChatOpenAI reads the endpoint and the API version from the environment, as documented.
    "azure_openai": ("gpt-4o-mini", "json_schema", {"base_url": None},
                     {"AZURE_OPENAI_ENDPOINT": "URL", "OPENAI_API_VERSION": "2024-10-21"}, []),
    "mistralai": ("mistral-large-latest", "function_calling", {}, {}, ["langchain-mistralai"]),
    # Cohere's v2 chat API (its own codec). ChatCohere reads its key from COHERE_API_KEY (`api_key`
    # is no name it knows).
    "cohere": ("command-a-03-2025", "json_schema", {"api_key": None}, {"COHERE_API_KEY": API_KEY}, ["langchain-cohere", "cohere"]),
    # Bedrock's OpenAI-compatible Mantle endpoint (langchain-aws ChatOpenAIMantle): an open-weight
    # model (Chat Completions under /v1; OpenAI's GPT models go to /openai/v1 and the Responses
    # API), the Bedrock API key from AWS_BEARER_TOKEN_BEDROCK as the OpenAI key.
    "bedrock_mantle_openai": ("openai.gpt-oss-120b", "json_schema", {"api_key": None}, {"AWS_BEARER_TOKEN_BEDROCK": API_KEY},
                              ["langchain-aws", "openai"]),
    # Meta's Model API (langchain-meta ChatMetaModel): OpenAI's Responses API by default.
    "meta": ("muse-spark-1.1", "json_schema", {}, {}, ["langchain-meta", "openai"]),
    # The LangSmith LLM gateway: ChatOpenAI on the Responses API (init_chat_model's _init_langsmith).
    "langsmith": ("gpt-4o-mini", "json_schema", {}, {}, ["openai"]),
    # langchain-huggingface's ChatHuggingFace with its `endpoint` backend (its default `pipeline`
    # runs the model in-process): huggingface_hub's InferenceClient at a provider's route of
    # Hugging Face's router (hf-inference here). Its with_structured_output refuses a Pydantic
    # model, so only the text kind has requests (the others' refusals are recorded).
    "huggingface": ("meta-llama/Llama-3.3-70B-Instruct", "json_schema",
                    {"base_url": None, "api_key": None, "backend": "endpoint", "provider": "hf-inference"}, {"HF_TOKEN": API_KEY},
                    ["langchain-huggingface", "huggingface_hub"]),
    # IBM watsonx.ai (langchain-ibm ChatWatsonx, its own venv): the URL, key and project from the
    # environment, as the package documents them (the generator sends its requests to the capture
    # server, see redirect_httpx).
    "ibm": ("ibm/granite-3-3-8b-instruct", "function_calling", {"base_url": None, "api_key": None},
            {"WATSONX_URL": "https://us-south.ml.cloud.ibm.com", "WATSONX_API_KEY": API_KEY,
             "WATSONX_PROJECT_ID": "00000000-0000-4000-8000-000000000001"}, []),
}

# The providers whose package calls OpenAI's Responses API (POST {base}/responses).
RESPONSES = {"meta", "langsmith"}

MODELS = {p: v[0] for p, v in PROVIDERS.items()}

# Error answers (status, body): what each package raises, and that we fail where it does.
ERROR_CASES = {
    "error_401": (401, {"error": {"message": "Incorrect API key provided: sk-wire****0001.", "type": "invalid_request_error",
                                  "code": "invalid_api_key"}}),
    "error_429": (429, {"error": {"message": "Rate limit reached for requests.", "type": "rate_limit_exceeded",
                                  "code": "rate_limit_exceeded"}}),
    "error_500": (500, {"error": {"message": "The server had an error while processing your request.", "type": "server_error",
                                  "code": None}}),
}


def error_cases(provider):
    """The error answers a provider's fixture has: the cohere SDK retries 429 and 5xx itself,
    with no switch langchain-cohere passes on, so Cohere's has the 401 only."""
    if provider == "cohere":
        return {k: v for k, v in ERROR_CASES.items() if k == "error_401"}
    return ERROR_CASES


def no_retry_kwargs(provider):
    """The arguments that turn the package's own retries off, for the error answers."""
    if provider == "litellm":
        # ChatLiteLLM's max_retries is its own loop; the OpenAI client inside litellm retries too.
        return {"max_retries": 0, "model_kwargs": {"max_retries": 0}}
    if provider == "huggingface":
        # ChatHuggingFace takes no max_retries (huggingface_hub's InferenceClient sends once).
        return {}
    return {"max_retries": 0}


def without_retries(provider, model):
    """ChatOpenRouter's `max_retries=0` leaves the openrouter SDK's default (back off on 5XX for up
    to an hour); its client is told not to retry instead. Nothing of the request changes."""
    if provider == "openrouter":
        from openrouter.utils import RetryConfig
        model.client.sdk_configuration.retry_config = RetryConfig("none", None, False)
    return model


def method(provider):
    return PROVIDERS[provider][1]


def setup(provider, url):
    """(init_chat_model kwargs, environment) for the capture server at `url`."""
    _, _, over, env, _ = PROVIDERS[provider]
    kwargs = {"temperature": 0.1, "max_tokens": 4096, "timeout": 300, "base_url": url, "api_key": API_KEY}
    for k, v in over.items():
        if v is None:
            kwargs.pop(k, None)
        else:
            kwargs[k] = v.replace("URL", url) if isinstance(v, str) else v
    return kwargs, {k: v.replace("URL", url) for k, v in env.items()}


def recorded(provider):
    return PROVIDERS[provider][4]


def cohere_reply(kind, case, model):
    """A v2 chat reply: the text as one content part, `MAX_TOKENS` when cut at the limit."""
    text, limited = content_for(kind, case)
    if case == "thinking":
        text = f"<think>\n{THOUGHT}\n</think>\n\n{text}"
    return {"id": "wire-cohere-0001", "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
            "finish_reason": "MAX_TOKENS" if limited else "COMPLETE",
            "usage": {"billed_units": {"input_tokens": USAGE_IN, "output_tokens": USAGE_OUT},
                      "tokens": {"input_tokens": USAGE_IN + 200, "output_tokens": USAGE_OUT}}}


def responses_reply(kind, case, model):
    """A Responses API reply: the text as one `output_text` part of a message item; cut at the
    output limit, `status: incomplete` with the reason; reasoning as a summary item before it."""
    text, limited = content_for(kind, case)
    output = [{"type": "message", "id": "msg_wire0001", "status": "incomplete" if limited else "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}]
    if case == "thinking":
        output.insert(0, {"type": "reasoning", "id": "rs_wire0001", "summary": [{"type": "summary_text", "text": THOUGHT}]})
    return {"id": "resp_wire0001", "object": "response", "created_at": 1764410400, "status": "incomplete" if limited else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if limited else None, "error": None, "model": model,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": USAGE_IN, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": USAGE_OUT,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": USAGE_IN + USAGE_OUT}}


def message_reply(provider, kind, case, model, tool):
    """A Chat Completions reply: the answer as a forced tool's call for the packages that asked for
    one (prose and fenced answers as content instead: a model ignoring the tool), else as content."""
    if provider == "cohere":
        return cohere_reply(kind, case, model)
    if provider in RESPONSES:
        return responses_reply(kind, case, model)
    text, limited = content_for(kind, case)
    finish = "length" if limited else "stop"
    message = {"role": "assistant", "content": text}
    if kind != "text" and method(provider) == "function_calling" and case not in ("prose", "fenced", "fenced_plain", "backticked"):
        a = answer_for(kind, case)
        arguments = content_for(kind, case)[0] if case in ("truncated", "truncated_stop") else json.dumps(a, ensure_ascii=False)
        message = {"role": "assistant", "content": "",
                   "tool_calls": [{"id": "call_wire0001", "type": "function", "function": {"name": tool, "arguments": arguments}}]}
        finish = "length" if limited else "tool_calls"
    if case == "thinking":
        # Reasoning models behind these APIs put their thoughts inline, before the answer.
        message["content"] = f"<think>\n{THOUGHT}\n</think>\n\n{message['content']}"
    reply = {"id": "chatcmpl-wire0001", "object": "chat.completion", "created": 1764410400, "model": model,
             "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
             "usage": {"prompt_tokens": USAGE_IN, "completion_tokens": USAGE_OUT, "total_tokens": USAGE_IN + USAGE_OUT}}
    if provider == "openrouter":
        # OpenRouter's replies carry it, and its SDK refuses a reply without it.
        reply["system_fingerprint"] = None
    return reply
