#!/usr/bin/env python3
"""Golden wire fixtures: what LangChain itself sends to each provider, and what it makes of replies.

For every provider (ollama, openai, anthropic, google_genai, and the OpenAI-compatible family,
Azure OpenAI, Mistral and Cohere of wire_compat.py) and every kind of model call the runtime makes (structured, envelope, text, decision), this runs the reference's own code path,
`init_chat_model(...)` and `.with_structured_output(Model)` / `.invoke(...)`, against a capture
server on loopback. The server records each request (path, headers, JSON body) and answers with
a canned reply in the provider's own wire format: a clean one, a fenced one, prose, truncated
JSON, extra keys, a wrong enum value, one with reasoning ("thinking") parts, ... For each reply
the result LangChain returns (or the exception it raises) is recorded next to the reply body.

tests/e2e/wire.rs replays both halves against the Rust runtime: our request for the same call is
compared with LangChain's field by field, and every reply body is served to our backend and our
reading compared with LangChain's.

usage: tests/parity/gen-wire-fixtures [PROVIDER ...]   (or: python3 tests/parity/gen_wire_fixtures.py)
       (every provider by default; naming some regenerates only theirs)

The cloud providers (bedrock_converse, bedrock, anthropic_bedrock, bedrock_mantle_anthropic:
langchain-aws; google_vertexai, google_anthropic_vertex: langchain-google-vertexai, in a second
venv WIRE_VENV-vertex, see VERTEX_PINS) run with fake credentials: AWS's example keys, and the
test-only service account of tests/fixtures/vertex whose token_uri is pointed at the capture
server. ibm (langchain-ibm) runs in a third venv, WIRE_VENV-ibm (IBM_PINS), its httpx requests
sent to the capture server (redirect_httpx). This also writes tests/fixtures/sigv4/botocore.json:
botocore's SigV4 signatures of fixed requests at a fixed time, and aws-bedrock-token-generator's
short-term Bedrock API keys (see sign_vectors).

The first run creates a venv (WIRE_VENV, default target/wire-venv) and installs the exact pins
below from PyPI; later runs reuse it. Output: tests/fixtures/wire/<provider>.json, pretty JSON in
a fixed order; the same pins give byte-identical files. Nothing leaves loopback besides pip.

Notes on the reference's behaviour the fixtures capture as they are:
- ChatOllama streams even for `.invoke()`; the capture server answers a streamed request with
  the reply body as the one (final) NDJSON line. The fixture keeps the body as a non-streamed
  reply, which is what our runtime (`"stream": false`) receives.
- ChatOllama takes no `api_key`; the ollama client reads OLLAMA_API_KEY from the environment, as
  the runtime does, so the generator sets it to the test key.
- The schema → Pydantic mapping is the reference's (`model_for`, as in gen_extra_vectors.py and
  ../shared/parity/gen_vectors.py): the model is named `Out`, optional fields are
  `Optional[T] = None`, unknown keys are ignored.
"""
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

PINS = [
    "langchain==1.5.0",
    "langchain-openai==1.7.4",
    "langchain-anthropic==1.7.10",
    "langchain-google-genai==4.4.3",
    "google-genai==3.6.1",
    "langchain-ollama==1.1.0",
    "pydantic==2.14.4",
    # Cloud providers (issue 30, parts 3 and 4): Bedrock here; Vertex AI in its own venv (below).
    "langchain-aws==1.9.1",
    # The OpenAI-compatible family, Azure OpenAI (langchain-openai above), Mistral and Cohere (wire_compat.py).
    "langchain-deepseek==1.1.1",
    "langchain-groq==1.1.3",
    "langchain-xai==1.3.0",
    "langchain-fireworks==1.7.1",
    "langchain-together==0.4.0",
    "langchain-openrouter==0.2.9",
    "langchain-perplexity==1.4.2",
    "langchain-nvidia-ai-endpoints==1.5.0",
    "langchain-baseten==0.2.5",
    "langchain-litellm==0.11.2",
    "langchain-azure-ai==1.2.9",
    "langchain-mistralai==1.1.6",
    "langchain-cohere==0.6.0",
    # The rest of init_chat_model's keys: Claude on Bedrock and Mantle (the anthropic SDK's
    # bedrock extra), Meta's Model API, Hugging Face.
    "aws-bedrock-token-generator==1.1.0",
    "langchain-meta==0.5.0",
    "langchain-huggingface==1.2.3",
]
# Installed without their dependencies, after PINS: langchain-upstage 0.7.7 asks for
# tokenizers<0.21, which litellm, langchain-mistralai and langchain-cohere exclude; it uses
# tokenizers only to count tokens, never in a request. Its other dependencies are above or here.
NO_DEPS = ["langchain-upstage==0.7.7", "pypdf==6.21.4"]
# Resolved versions recorded in every fixture (pip picks the ones not pinned above).
RECORDED = ["langchain", "langchain-core", "langchain-openai", "langchain-anthropic", "langchain-google-genai",
            "langchain-ollama", "google-genai", "openai", "anthropic", "ollama", "pydantic", "pydantic-core", "httpx"]
# Cloud providers: what each group's fixtures record besides the above.
CLOUD_RECORDED = {"main": ["langchain-aws", "boto3", "botocore"],
                  "vertex": ["langchain-google-vertexai", "google-cloud-aiplatform", "google-auth"]}
# What the Claude-on-a-cloud fixtures record besides their group's.
ANTHROPIC_RECORDED = ["anthropic", "langchain-anthropic"]
# langchain-google-vertexai needs google-cloud-aiplatform, which caps google-genai below 3: it gets
# a venv of its own so that the google_genai fixture keeps google-genai 3.6.1.
VERTEX_PINS = ["langchain==1.5.0", "langchain-google-vertexai==3.2.5", "pydantic==2.14.4",
               # ChatAnthropicVertex (google_anthropic_vertex) calls the anthropic SDK's AnthropicVertex with
               # `temperature`, which the 2.x SDKs no longer take (TypeError): the newest 0.x.
               "anthropic[vertex]==0.125.0"]
# langchain-ibm's ibm-watsonx-ai pins ibm-cos-sdk, whose jmespath<=1.0.1 boto3 excludes: a venv
# of its own too.
IBM_PINS = ["langchain==1.5.0", "langchain-ibm==1.1.2", "pydantic==2.14.4"]
IBM_RECORDED = ["langchain", "langchain-core", "pydantic", "pydantic-core", "httpx", "langchain-ibm", "ibm-watsonx-ai"]
# ChatWatsonx reaches IBM Cloud only (its SDK picks the IAM endpoint and the project API from
# the watsonx.ai URL): the generator points it at a real region and sends every request of its
# httpx client to the capture server instead. The IAM token is a JWT the SDK reads the expiry of.
IBM_URL = "https://us-south.ml.cloud.ibm.com"
IBM_PROJECT = "00000000-0000-4000-8000-000000000001"
IBM_TOKEN_PATH = "/identity/token"
IBM_TOKEN = ("eyJhbGciOiJSUzI1NiIsImtpZCI6InRlc3QifQ.eyJpYW1faWQiOiJJQk1pZC10ZXN0IiwiZXhwIjo0MTAyNDQ0ODAwLCJpYXQiOjE3NjQ0MTA0MDB9"
             ".dGVzdC1zaWduYXR1cmU")


def group_of(provider):
    return "vertex" if provider in VERTEX_PROVIDERS else "ibm" if provider == "ibm" else "main"


def redirect_httpx(url):
    """Every request of an httpx client goes to the capture server at `url`, path and query kept."""
    import httpx
    from urllib.parse import urlsplit
    target = urlsplit(url)
    # The SDK's own retries of 429 and 5xx (ten by default, read at each request) off, so that an
    # error answer is one request.
    os.environ["WATSONX_MAX_RETRIES"] = "0"
    if getattr(httpx.HTTPTransport, "_wire_redirected", False):
        return
    original = httpx.HTTPTransport.handle_request

    def handle(self, request):
        request.url = request.url.copy_with(scheme="http", host=target.hostname, port=target.port)
        return original(self, request)
    httpx.HTTPTransport.handle_request = handle
    httpx.HTTPTransport._wire_redirected = True

REPO = Path(__file__).resolve().parents[2]
GENERATOR = "tests/parity/gen_wire_fixtures.py"
OUT_DIR = REPO / "tests/fixtures/wire"
API_KEY = "test-key-123"
KEY_PLACEHOLDER = "<api-key>"


def venv_dir(group="main"):
    if os.environ.get("WIRE_VENV"):
        main = Path(os.environ["WIRE_VENV"]).resolve()
    else:
        main = (Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "wire-venv").resolve()
    return main if group == "main" else main.with_name(f"{main.name}-{group}")


def group_arg():
    """`--group vertex` runs the Vertex AI group (its own venv); the default runs the others."""
    return sys.argv[sys.argv.index("--group") + 1] if "--group" in sys.argv else "main"


def ensure_venv(group="main"):
    """Re-runs this script inside a venv holding exactly the group's pins (created on first use)."""
    venv = venv_dir(group)
    python = venv / "bin" / "python"
    if Path(sys.prefix).resolve() == venv:
        return
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    stamp = venv / "wire-pins.txt"
    pins = {"main": PINS, "vertex": VERTEX_PINS, "ibm": IBM_PINS}[group]
    # Every package of the venv, the dependencies too, at the version the committed fixtures were
    # made with: the same files come out however PyPI moves.
    name = "wire-constraints.txt" if group == "main" else f"wire-constraints-{group}.txt"
    constraints = Path(__file__).resolve().parent / name
    no_deps = NO_DEPS if group == "main" else []
    wanted = "\n".join(pins + no_deps) + "\n" + constraints.read_text()
    if not stamp.exists() or stamp.read_text() != wanted:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(constraints), *pins],
                       check=True)
        if no_deps:
            subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-c", str(constraints), *no_deps],
                           check=True)
        stamp.write_text(wanted)
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])


def isolate_environment():
    """No proxy, no provider settings and no tracing from the caller's environment."""
    prefixes = ("OPENAI", "ANTHROPIC", "GOOGLE", "GEMINI", "OLLAMA", "LANGCHAIN", "LANGSMITH", "LANGGRAPH", "AWS", "BEDROCK", "CLOUD_ML",
                "GCLOUD", "CLOUDSDK", "AZURE", "DEEPSEEK", "GROQ", "XAI", "FIREWORKS", "TOGETHER", "OPENROUTER", "PPLX", "PERPLEXITY",
                "NVIDIA", "UPSTAGE", "BASETEN", "LITELLM", "MISTRAL", "COHERE", "CO_", "HF_", "HUGGINGFACE", "MODEL_API", "LLAMA",
                "WATSONX", "IBM")
    for k in list(os.environ):
        if k.upper().endswith("_PROXY") or k.upper().startswith(prefixes):
            del os.environ[k]
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
    # The ollama client's only way to a key (ChatOllama has no api_key field).
    os.environ["OLLAMA_API_KEY"] = API_KEY


# ---- what is asked ----

SYSTEM = ("You are the support desk assistant of Example Corp. Be accurate and brief.\n"
          "Classify the customer's ticket. Reply with the category, the priority (1-3), tags and a summary.\n")
USER = 'goal: {"ticket":"I was charged twice for my €20 plan — please refund one."}'

MODELS = {"ollama": "qwen3:14b", "openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-5", "google_genai": "gemini-2.5-flash"}

STRUCTURED = {"type": "object", "properties": {
    "category": {"type": "string", "enum": ["billing", "technical", "other"]},
    "priority": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "summary": {"type": "string"}},
    "required": ["category", "priority"]}
ENVELOPE = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
TOOLS = ["kb_search", "create_ticket"]
KINDS = ["structured", "envelope", "text", "decision"]


def model_for(schema):
    """The reference's schema → Pydantic mapping, the one of gen_extra_vectors.py (imported once the
    venv with pydantic runs this script)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_extra_vectors import model_for as reference_model_for
    return reference_model_for(schema)


def agent_decision(tools):
    """A Pydantic mirror of the runtime's decision schema (runtime/src/decision.rs, DecisionSpec::new),
    with its descriptions."""
    from typing import Literal, Optional
    from pydantic import Field, create_model
    model = create_model(
        "AgentDecision",
        action=(Literal["tool_call", "ask", "done"], ...),
        tool_name=(Optional[Literal[tuple(tools)]], Field(None, description="The tool to call, for action tool_call.")),
        arguments=(Optional[dict], Field(None, description="The tool's arguments, matching its input schema, for action tool_call.")),
        message=(Optional[str], Field(None, description="The question for action ask, or the final answer for action done.")),
    )
    model.__doc__ = "The next step: call one tool, ask the user one question, or finish with the answer."
    return model


# ---- the replies ----

ANSWERS = {
    "structured": {"category": "billing", "priority": 2, "tags": ["refund", "duplicate-charge"],
                   "summary": "Charged twice for the €20 plan."},
    "envelope": {"text": "We refunded the duplicate €20 charge; it shows within 5 days."},
    "decision": {"action": "tool_call", "tool_name": "kb_search", "arguments": {"query": "duplicate charge refund"}},
}
TEXT_ANSWER = "We refunded the duplicate €20 charge; it shows within 5 days."
PROSE = "The customer was charged twice for the same plan, so this is a billing matter of medium priority."
THOUGHT = "The customer mentions a duplicate charge, so this is about billing. I should answer in the requested shape."
JSON_CASES = ["clean", "fenced", "fenced_plain", "backticked", "prose", "truncated", "truncated_stop", "extra_keys", "wrong_enum",
              "thinking"]
EXTRA_CASES = {
    "structured": ["lax_number"],
    "envelope": [],
    "decision": ["done", "unknown_tool"],
}
TEXT_CASES = ["clean", "fenced", "truncated", "thinking"]


def cases_for(kind):
    if kind == "text":
        return TEXT_CASES
    return JSON_CASES + EXTRA_CASES[kind]


def answer_for(kind, case):
    """The model's answer: an object for the JSON kinds (None when it answers in prose), else text."""
    if kind == "text":
        return TEXT_ANSWER
    a = dict(ANSWERS[kind])
    if case == "extra_keys":
        a.update({"confidence": 0.92, "language": "en"})
    elif case == "wrong_enum":
        if kind == "structured":
            a["category"] = "sales"
        elif kind == "decision":
            a["action"] = "escalate"
        else:  # the envelope has no enum: a wrong type instead
            a["text"] = 42
    elif case == "lax_number":
        a["priority"] = "2"
    elif case == "done":
        a = {"action": "done", "message": "We refunded the duplicate charge."}
    elif case == "unknown_tool":
        a["tool_name"] = "delete_account"
    return a


def cut(text):
    """The text cut a little past its middle, as an output limit leaves it."""
    return text[: len(text) * 3 // 5]


def content_for(kind, case):
    """(the model's text, whether it was cut at the output limit)."""
    a = answer_for(kind, case)
    text = a if isinstance(a, str) else json.dumps(a, ensure_ascii=False)
    if case == "fenced":
        if kind == "text":
            return f"```\n{a}\n```", False
        return f"```json\n{json.dumps(a, ensure_ascii=False, indent=2)}\n```", False
    if case == "fenced_plain":
        return f"```\n{json.dumps(a, ensure_ascii=False)}\n```", False
    if case == "backticked":
        return f"`{json.dumps(a, ensure_ascii=False)}`", False
    if case == "prose":
        return PROSE, False
    if case in ("truncated", "truncated_stop"):
        return cut(text), case == "truncated"
    return text, False


USAGE_IN, USAGE_OUT, USAGE_THOUGHT = 48, 21, 17


def ollama_reply(kind, case, model):
    text, limited = content_for(kind, case)
    message = {"role": "assistant", "content": text}
    if case == "thinking":
        message["thinking"] = THOUGHT
    return {"model": model, "created_at": "2026-11-29T10:00:00.000000Z", "message": message, "done": True,
            "done_reason": "length" if limited else "stop", "total_duration": 1843256000, "load_duration": 21345000,
            "prompt_eval_count": USAGE_IN, "prompt_eval_duration": 112000000, "eval_count": USAGE_OUT, "eval_duration": 1690000000}


def openai_reply(kind, case, model):
    text, limited = content_for(kind, case)
    if case == "thinking":
        # OpenAI's chat API has no reasoning parts; an OpenAI-compatible server may put them inline.
        text = f"<think>\n{THOUGHT}\n</think>\n\n{text}"
    return {"id": "chatcmpl-wire0001", "object": "chat.completion", "created": 1764410400, "model": f"{model}-2024-07-18",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None, "annotations": []},
                         "logprobs": None, "finish_reason": "length" if limited else "stop"}],
            "usage": {"prompt_tokens": USAGE_IN, "completion_tokens": USAGE_OUT, "total_tokens": USAGE_IN + USAGE_OUT,
                      "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                      "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
                                                    "rejected_prediction_tokens": 0}},
            "service_tier": "default", "system_fingerprint": "fp_wire0001"}


def gemini_reply(kind, case, model):
    text, limited = content_for(kind, case)
    parts = [{"text": text}]
    usage = {"promptTokenCount": USAGE_IN, "candidatesTokenCount": USAGE_OUT, "totalTokenCount": USAGE_IN + USAGE_OUT,
             "promptTokensDetails": [{"modality": "TEXT", "tokenCount": USAGE_IN}]}
    if case == "thinking":
        parts.insert(0, {"text": f"**Classifying the ticket**\n\n{THOUGHT}", "thought": True})
        usage["thoughtsTokenCount"] = USAGE_THOUGHT
        usage["totalTokenCount"] += USAGE_THOUGHT
    return {"candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": "MAX_TOKENS" if limited else "STOP", "index": 0}],
            "usageMetadata": usage, "modelVersion": model, "responseId": "wire-response-0001"}


def anthropic_reply(kind, case, model, tool):
    """Structured kinds answer with the forced tool's `tool_use` block; prose and fenced answers come
    as a text block instead (a model ignoring the tool), truncated ones with `stop_reason: max_tokens`."""
    blocks, stop = [], "end_turn"
    if case == "thinking":
        blocks.append({"type": "thinking", "thinking": THOUGHT, "signature": "EqQBCkgIBhABGAIqQLwire0001signature"})
    if kind == "text":
        text, limited = content_for(kind, case)
        blocks.append({"type": "text", "text": text})
        stop = "max_tokens" if limited else "end_turn"
    elif case in ("prose", "fenced", "fenced_plain", "backticked"):
        blocks.append({"type": "text", "text": content_for(kind, case)[0]})
    else:
        a = answer_for(kind, case)
        if case in ("truncated", "truncated_stop"):
            # A tool input is always an object: the same cut JSON as the other providers get,
            # closed as a partial-JSON parser closes it.
            from langchain_core.utils.json import parse_partial_json
            a = parse_partial_json(content_for(kind, case)[0])
        blocks.append({"type": "tool_use", "id": "toolu_wire0001", "name": tool, "input": a})
        stop = "max_tokens" if case == "truncated" else "tool_use"
    return {"id": "msg_wire0001", "type": "message", "role": "assistant", "model": f"{model}-20250929", "content": blocks,
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": USAGE_IN, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                      "output_tokens": USAGE_OUT, "service_tier": "standard"}}


def reply_for(provider, kind, case):
    if provider in CLOUD_MODELS:
        return cloud_reply(provider, kind, case)
    model = all_models()[provider]
    if provider in compat().PROVIDERS:
        return compat().message_reply(provider, kind, case, model, {"decision": "AgentDecision"}.get(kind, "Out"))
    if provider == "ollama":
        return ollama_reply(kind, case, model)
    if provider == "openai":
        return openai_reply(kind, case, model)
    if provider == "google_genai":
        return gemini_reply(kind, case, model)
    tool = {"structured": "Out", "envelope": "Out", "decision": "AgentDecision"}.get(kind)
    return anthropic_reply(kind, case, model, tool)


# ---- the cloud providers: Bedrock (langchain-aws) and Vertex AI (langchain-google-vertexai) ----

CLOUD_MODELS = {"bedrock_converse": "anthropic.claude-3-5-haiku-20241022-v1:0",
                # ChatBedrock (init_chat_model's `bedrock`) calls Converse itself for Nova models only:
                # the one case where the reference sends what this runtime sends for `bedrock:`.
                "bedrock": "amazon.nova-lite-v1:0",
                "google_vertexai": "gemini-2.5-flash",
                # Claude through the anthropic SDK's cloud clients: Bedrock's InvokeModel
                # (ChatAnthropicBedrock), Bedrock's Mantle endpoint (ChatAnthropicMantle) and Vertex
                # AI's rawPredict (ChatAnthropicVertex).
                "anthropic_bedrock": "anthropic.claude-3-5-haiku-20241022-v1:0",
                "bedrock_mantle_anthropic": "anthropic.claude-haiku-4-5",
                "google_anthropic_vertex": "claude-sonnet-4-5@20250929"}
MODELS.update(CLOUD_MODELS)
VERTEX_PROVIDERS = {"google_vertexai", "google_anthropic_vertex"}
# The cloud providers that speak Anthropic's Messages API (their replies are Anthropic's).
ANTHROPIC_HOSTED = {"anthropic_bedrock", "bedrock_mantle_anthropic", "google_anthropic_vertex"}
# Fake credentials, the AWS documentation's example ones; never valid anywhere.
AWS_KEY_ID, AWS_SECRET = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
AWS_REGION = "us-east-1"
TOKEN_PATH = "/token"
# What the capture server's token endpoint answers a service account's JWT grant with.
TOKEN_REPLY = {"access_token": "ya29.test-access-token", "expires_in": 3599, "token_type": "Bearer"}
# The test-only service account (its key made for the tests, valid nowhere).
SERVICE_ACCOUNT = REPO / "tests/fixtures/vertex/service-account.json"


def cloud_recorded(provider):
    group = "vertex" if provider in VERTEX_PROVIDERS else "main"
    extra = ANTHROPIC_RECORDED if provider in ANTHROPIC_HOSTED else []
    if provider == "google_anthropic_vertex":
        extra = ["anthropic"]
    return ["langchain", "langchain-core", "pydantic", "pydantic-core", "httpx", *CLOUD_RECORDED[group], *extra]


def cloud_environment():
    """Fake AWS credentials for boto3, and for Vertex AI the test service account with its
    `token_uri` on the capture server (written into a copy of the file once the port is known)."""
    os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = AWS_KEY_ID, AWS_SECRET
    os.environ["AWS_REGION"] = AWS_REGION
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ["AWS_CONFIG_FILE"] = os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull


def cloud_chat_model(provider, url):
    from langchain.chat_models import init_chat_model
    if provider == "anthropic_bedrock":
        # The anthropic SDK's AnthropicBedrock takes its endpoint from ANTHROPIC_BEDROCK_BASE_URL
        # (ChatAnthropicBedrock passes no base URL on); the keys and region from the environment.
        os.environ["ANTHROPIC_BEDROCK_BASE_URL"] = url
        return init_chat_model(f"{provider}:{MODELS[provider]}", temperature=0.1, max_tokens=4096, timeout=300, max_retries=0)
    if provider == "bedrock_mantle_anthropic":
        # SigV4 with the access keys of the environment (service `bedrock-mantle`).
        return init_chat_model(f"{provider}:{MODELS[provider]}", temperature=0.1, max_tokens=4096, timeout=300, base_url=url,
                               max_retries=0)
    if provider in VERTEX_PROVIDERS:
        account = json.loads(SERVICE_ACCOUNT.read_text())
        account["token_uri"] = url + TOKEN_PATH
        path = venv_dir("vertex") / "service-account.json"
        path.write_text(json.dumps(account))
        os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = str(path)
        if provider == "google_anthropic_vertex":
            # The anthropic SDK's AnthropicVertex; its base URL ends in /v1 as the default one does.
            return init_chat_model(f"{provider}:{MODELS[provider]}", temperature=0.1, max_tokens=4096, timeout=300,
                                   base_url=url + "/v1", project=account["project_id"], location="us-central1", max_retries=0)
        # REST, not gRPC, so that the capture server sees the request; no retries, so that an
        # error reply is one request.
        return init_chat_model(f"{provider}:{MODELS[provider]}", temperature=0.1, max_tokens=4096, timeout=300,
                               base_url=url, api_transport="rest", max_retries=0)
    from botocore.config import Config
    # ChatBedrock names the endpoint override `endpoint_url` only (ChatBedrockConverse: `base_url` too).
    return init_chat_model(f"{provider}:{MODELS[provider]}", temperature=0.1, max_tokens=4096, endpoint_url=url,
                           region_name=AWS_REGION, config=Config(retries={"total_max_attempts": 1}))


def stable_properties(body):
    """ChatVertexAI builds a schema's `properties` in a set's order, which changes per run: sorted."""
    if isinstance(body, dict):
        return {k: (dict(sorted((n, stable_properties(p)) for n, p in v.items())) if k == "properties" and isinstance(v, dict)
                    else stable_properties(v)) for k, v in body.items()}
    if isinstance(body, list):
        return [stable_properties(v) for v in body]
    return body


def scrub_cloud_header(name, value):
    """A SigV4 signature covers the time and the capture server's port: the scheme, credential
    scope and signed headers are kept, the date and the signature are not."""
    if name == "authorization" and value.startswith("AWS4-HMAC-SHA256"):
        value = re.sub(r"Credential=([^/]+)/\d{8}/", r"Credential=\1/<date>/", value)
        return re.sub(r"Signature=[0-9a-f]{64}", "Signature=<signature>", value)
    if name == "x-amz-date":
        return "<date>"
    if name == "amz-sdk-invocation-id":
        return "<uuid>"
    if name == "user-agent" and " m/" in value:
        # botocore lists the features it used (`m/e,E,b,N,Z`) in a set's order, which changes per run.
        return re.sub(r" m/([^ ]+)", lambda m: " m/" + ",".join(sorted(m.group(1).split(","))), value)
    if name == "authorization" and value.startswith("Bearer ey"):
        # google-auth's self-signed JWT (its time changes on every run): what it says, not its bytes.
        import base64
        head, claims = (json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4))) for p in value[7:].split(".")[:2])
        return (f"Bearer <self-signed JWT: alg={head['alg']} kid={head.get('kid')} iss={claims['iss']} sub={claims.get('sub')} "
                f"aud={claims.get('aud')} scope={claims.get('scope')} lifetime={claims['exp'] - claims['iat']}s>")
    return value


def bedrock_bearer_request(provider, capture, messages):
    """A text call with the Bedrock API key (`AWS_BEARER_TOKEN_BEDROCK`) instead of the access keys.
    botocore refuses to send a bearer token over plain HTTP (recorded as `over_http`); for the
    request itself its HTTPS check is lifted for the loopback capture server, nothing else changed."""
    import botocore.auth
    os.environ["AWS_BEARER_TOKEN_BEDROCK"] = API_KEY
    try:
        capture.status, capture.reply_headers, capture.reply = 200, {}, cloud_reply(provider, "text", "clean")
        over_http = outcome("text", lambda: chat_model(provider, capture.url).invoke(messages), capture.url)
        capture.requests.clear()
        checked = botocore.auth.BearerAuth.add_auth

        def loopback_ok(self, request):
            request.url = request.url.replace("http://127.0.0.1", "https://127.0.0.1", 1)
            checked(self, request)
            request.url = request.url.replace("https://127.0.0.1", "http://127.0.0.1", 1)
        botocore.auth.BearerAuth.add_auth = loopback_ok
        try:
            chat_model(provider, capture.url).invoke(messages)
        finally:
            botocore.auth.BearerAuth.add_auth = checked
        req = capture.requests[0]
        return {"over_http": over_http, "method": req["method"], "path": req["path"], "headers": scrub_headers(req["headers"])}
    finally:
        del os.environ["AWS_BEARER_TOKEN_BEDROCK"]


# Error answers, each as its provider sends it (Bedrock: the code in `x-amzn-ErrorType`, the
# message in the body; Vertex AI: Google's error object).
CLOUD_ERRORS = {"throttled": 429, "invalid": 400, "unavailable": 503}


def cloud_error_cases(provider, kind):
    return list(CLOUD_ERRORS) if provider in CLOUD_MODELS and kind == "structured" else []


def cloud_error_status(provider, case):
    if case not in CLOUD_ERRORS:
        return 200, {}
    if provider in VERTEX_PROVIDERS or provider == "bedrock_mantle_anthropic":
        return CLOUD_ERRORS[case], {}
    code = {"throttled": "ThrottlingException", "invalid": "ValidationException", "unavailable": "ServiceUnavailableException"}[case]
    return CLOUD_ERRORS[case], {"x-amzn-ErrorType": f"{code}:http://internal.amazon.com/coral/com.amazon.bedrock/"}


def cloud_reply(provider, kind, case):
    model = MODELS[provider]
    if case in CLOUD_ERRORS:
        if provider == "bedrock_mantle_anthropic":
            kind_ = {"throttled": "rate_limit_error", "invalid": "invalid_request_error", "unavailable": "api_error"}[case]
            return {"type": "error", "error": {"type": kind_, "message": f"{kind_} (test)"}}
        if provider in VERTEX_PROVIDERS:
            status = {"throttled": "RESOURCE_EXHAUSTED", "invalid": "INVALID_ARGUMENT", "unavailable": "UNAVAILABLE"}[case]
            return {"error": {"code": CLOUD_ERRORS[case], "message": f"{status.lower()} (test)", "status": status}}
        return {"message": {"throttled": "Too many requests, please wait before trying again.",
                            "invalid": "The provided model identifier is invalid.",
                            "unavailable": "Bedrock is unable to process your request."}[case]}
    if provider in ANTHROPIC_HOSTED:
        return anthropic_reply(kind, case, model, {"structured": "Out", "envelope": "Out", "decision": "AgentDecision"}.get(kind))
    if provider in VERTEX_PROVIDERS:
        return vertex_reply(kind, case, model)
    return converse_reply(kind, case)


def vertex_reply(kind, case, model):
    """Gemini on Vertex AI: ChatVertexAI asks for structured output as a forced function call,
    so structured kinds answer with a `functionCall` part (prose and fenced answers as a text part
    instead, a model ignoring the function); text answers as on the Gemini API."""
    reply = gemini_reply(kind, case, model)
    reply["createTime"] = "2026-11-29T10:00:00.000000Z"
    if kind == "text" or case in ("prose", "fenced", "fenced_plain", "backticked"):
        return reply
    a = answer_for(kind, case)
    if case in ("truncated", "truncated_stop"):
        from langchain_core.utils.json import parse_partial_json
        a = parse_partial_json(content_for(kind, case)[0])
    parts = reply["candidates"][0]["content"]["parts"]
    parts[-1] = {"functionCall": {"name": {"decision": "AgentDecision"}.get(kind, "Out"), "args": a}}
    return reply


def converse_reply(kind, case):
    """Bedrock Converse: structured kinds answer with the forced tool's `toolUse` block; prose and
    fenced answers come as a text block (a model ignoring the tool), truncated ones with
    `stopReason: max_tokens`."""
    blocks, stop = [], "end_turn"
    if case == "thinking":
        blocks.append({"reasoningContent": {"reasoningText": {"text": THOUGHT, "signature": "EqQBCkgIBhABGAIqQLwire0001signature"}}})
    if kind == "text":
        text, limited = content_for(kind, case)
        blocks.append({"text": text})
        stop = "max_tokens" if limited else "end_turn"
    elif case in ("prose", "fenced", "fenced_plain", "backticked"):
        blocks.append({"text": content_for(kind, case)[0]})
    else:
        a = answer_for(kind, case)
        if case in ("truncated", "truncated_stop"):
            from langchain_core.utils.json import parse_partial_json
            a = parse_partial_json(content_for(kind, case)[0])
        tool = {"decision": "AgentDecision"}.get(kind, "Out")
        blocks.append({"toolUse": {"toolUseId": "tooluse_wire0001", "name": tool, "input": a}})
        stop = "max_tokens" if case == "truncated" else "tool_use"
    return {"output": {"message": {"role": "assistant", "content": blocks}}, "stopReason": stop,
            "usage": {"inputTokens": USAGE_IN, "outputTokens": USAGE_OUT, "totalTokens": USAGE_IN + USAGE_OUT},
            "metrics": {"latencyMs": 812}}


# SigV4 vectors: fixed requests signed by botocore with fixed credentials at a fixed time; the
# runtime's signer must compute the same `Authorization` header (tests/e2e/cloud.rs).
SIGV4_TIME = "2026-11-29T10:00:00"
SIGV4_REQUESTS = [
    {"url": "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse",
     "region": "us-east-1", "session_token": None, "body": {"messages": [{"role": "user", "content": [{"text": "hi"}]}]}},
    {"url": "https://bedrock-runtime.eu-west-3.amazonaws.com/model/eu.amazon.nova-lite-v1%3A0/converse",
     "region": "eu-west-3", "session_token": "IQoJb3JpZ2luX2VjEXAMPLETOKEN//////////wEaCXVzLWVhc3QtMSJHMEUCIQ==",
     "body": {"messages": [{"role": "user", "content": [{"text": "€20 — refund"}]}], "inferenceConfig": {"maxTokens": 4096}}},
    {"url": "http://127.0.0.1:8123/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude/converse",
     "region": "us-east-1", "session_token": None, "body": {}},
    # The anthropic SDK's InvokeModel path keeps the model id's `:` (anthropic_bedrock), and Mantle
    # signs for `bedrock-mantle` (bedrock_mantle_anthropic).
    {"url": "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-5-haiku-20241022-v1:0/invoke",
     "region": "us-east-1", "session_token": None, "body": {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 4096}},
    {"url": "https://bedrock-mantle.eu-west-3.api.aws/anthropic/v1/messages", "region": "eu-west-3", "service": "bedrock-mantle",
     "session_token": "IQoJb3JpZ2luX2VjEXAMPLETOKEN//////////wEaCXVzLWVhc3QtMSJHMEUCIQ==",
     "body": {"model": "anthropic.claude-haiku-4-5", "max_tokens": 4096}},
]


def sign_vectors():
    import datetime
    from unittest import mock
    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    from importlib.metadata import version
    fixed = datetime.datetime.fromisoformat(SIGV4_TIME)
    vectors = []
    for r in SIGV4_REQUESTS:
        body = json.dumps(r["body"], ensure_ascii=False).encode()
        req = AWSRequest(method="POST", url=r["url"], data=body, headers={"content-type": "application/json"})
        signer = botocore.auth.SigV4Auth(Credentials(AWS_KEY_ID, AWS_SECRET, r["session_token"]), r.get("service", "bedrock"), r["region"])
        with mock.patch("botocore.auth.get_current_datetime", return_value=fixed):
            signer.add_auth(req)
        vectors.append({**r, "body": body.decode(), "time": SIGV4_TIME + "Z", "access_key_id": AWS_KEY_ID, "secret_access_key": AWS_SECRET,
                        "x-amz-date": req.headers["X-Amz-Date"], "authorization": req.headers["Authorization"]})
    # Short-term Bedrock API keys as aws-bedrock-token-generator makes them from AWS keys (what
    # ChatOpenAIMantle sends without AWS_BEARER_TOKEN_BEDROCK): a presigned URL, base64.
    from aws_bedrock_token_generator.token_generator import _generate_token
    tokens = []
    for region, session_token in [("us-east-1", None), ("eu-west-3", "IQoJb3JpZ2luX2VjEXAMPLETOKEN//////////wEaCXVzLWVhc3QtMSJHMEUCIQ==")]:
        with mock.patch("botocore.auth.get_current_datetime", return_value=fixed):
            token = _generate_token(Credentials(AWS_KEY_ID, AWS_SECRET, session_token), region, 43200)
        tokens.append({"region": region, "session_token": session_token, "expires": 43200, "time": SIGV4_TIME + "Z",
                       "access_key_id": AWS_KEY_ID, "secret_access_key": AWS_SECRET, "token": token})
    path = OUT_DIR.parent / "sigv4" / "botocore.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"generator": GENERATOR, "packages": {"botocore": version("botocore"),
                                                                    "aws-bedrock-token-generator": version("aws-bedrock-token-generator")},
                                "service": "bedrock", "vectors": vectors, "bedrock_api_keys": tokens}, ensure_ascii=False, indent=2) + "\n")
    print(f"{path.relative_to(REPO)}: {len(vectors)} signed requests")


# ---- the capture server ----

class Capture:
    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        capture = self
        self.requests = []
        self.token_requests = []
        self.reply = None
        self.status = 200
        self.reply_headers = {}
        self.model = None

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                # The model list ChatNVIDIA reads before a structured call, the project and the
                # model specs ibm-watsonx-ai reads when ChatWatsonx is built; not model calls.
                if self.path.startswith("/api/models/"):
                    # The model card huggingface_hub reads to find the provider of a model.
                    got = {"id": capture.model, "pipeline_tag": "text-generation", "tags": ["conversational"],
                           "inferenceProviderMapping": [{"provider": "hf-inference", "providerId": capture.model, "status": "live",
                                                         "task": "conversational"}]}
                elif self.path.startswith("/v2/projects/"):
                    got = {"metadata": {"guid": IBM_PROJECT}, "entity": {"name": "wire", "storage": {"type": "bmcos_object_storage"},
                                                                         "compute": [{"type": "machine_learning", "guid": "wml-wire", "name": "wml"}]}}
                elif self.path.startswith("/ml/v1/foundation_model_specs"):
                    got = {"total_count": 1, "limit": 200, "resources": [{"model_id": capture.model, "label": capture.model, "provider": "IBM",
                                                                          "functions": [{"id": "text_chat"}, {"id": "text_generation"}]}]}
                else:
                    got = {"object": "list", "data": [{"id": capture.model, "object": "model"}]}
                out = json.dumps(got).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n)
                if self.path in (TOKEN_PATH, IBM_TOKEN_PATH):
                    # The OAuth token exchange of a service account (Vertex AI) or of an IBM Cloud
                    # API key: answered; IBM's request kept apart (the fixture's `token_request`).
                    got = TOKEN_REPLY
                    if self.path == IBM_TOKEN_PATH:
                        capture.token_requests.append({"method": self.command, "path": self.path,
                                                       "headers": {k.lower(): v for k, v in self.headers.items()}, "form": raw.decode()})
                        got = {"access_token": IBM_TOKEN, "refresh_token": "not_supported", "token_type": "Bearer", "expires_in": 3600,
                               "expiration": 4102444800, "scope": "ibm openid"}
                    out = json.dumps(got).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                    return
                body = json.loads(raw) if raw else None
                headers = {}
                for k, v in self.headers.items():
                    headers[k.lower()] = v
                capture.requests.append({"method": self.command, "path": self.path, "headers": headers, "body": body})
                out = json.dumps(capture.reply, ensure_ascii=False).encode()
                streamed = isinstance(body, dict) and body.get("stream") is True
                if streamed:
                    out += b"\n"  # Ollama's stream: one NDJSON line, the final one
                self.send_response(capture.status)
                for k, v in capture.reply_headers.items():
                    self.send_header(k, v)
                self.send_header("content-type", "application/x-ndjson" if streamed else "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


# Transport details that say nothing about the call (and the port changes on every run).
DROPPED_HEADERS = {"host", "content-length", "x-amzn-trace-id"}  # (huggingface_hub: a random id per request)


def scrub_headers(headers):
    out = {}
    for k in sorted(headers):
        if k in DROPPED_HEADERS:
            continue
        out[k] = scrub_cloud_header(k, headers[k].replace(IBM_TOKEN, "<iam-token>")).replace(API_KEY, KEY_PLACEHOLDER)
    return out


def compat():
    """The OpenAI-compatible family, Azure OpenAI and Mistral (imported once the venv runs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import wire_compat
    return wire_compat


def all_models():
    return {**MODELS, **compat().MODELS}


def chat_model(provider, url, **extra):
    if provider in CLOUD_MODELS:
        return cloud_chat_model(provider, url)
    from langchain.chat_models import init_chat_model
    if provider == "ibm":
        redirect_httpx(url)
    if provider == "huggingface":
        # huggingface_hub's Hub (the model card) and the router's provider routes, at the capture server.
        import huggingface_hub.constants as hf
        hf.ENDPOINT = url
        hf.INFERENCE_PROXY_TEMPLATE = url + "/{provider}"
    if provider in compat().PROVIDERS:
        kwargs, env = compat().setup(provider, url)
        os.environ.update(env)
        try:
            return init_chat_model(f"{provider}:{all_models()[provider]}", **kwargs, **extra)
        finally:
            for k in env:
                del os.environ[k]
    # The kwargs the Python runtime passes; each provider class takes these names (or aliases of them).
    return init_chat_model(f"{provider}:{MODELS[provider]}", temperature=0.1, max_tokens=4096, timeout=300,
                           base_url=url, api_key=API_KEY)


def runnable_for(provider, kind, url, **extra):
    m = chat_model(provider, url, **extra)
    if kind == "structured":
        return m.with_structured_output(model_for(STRUCTURED))
    if kind == "envelope":
        return m.with_structured_output(model_for(ENVELOPE))
    if kind == "decision":
        return m.with_structured_output(agent_decision(TOOLS))
    return m


def outcome(kind, run, url):
    try:
        r = run()
    except Exception as e:  # noqa: BLE001 - every failure is part of the record
        text = str(e).replace(url, "<capture>")
        # The cohere SDK's errors quote the reply's headers: the date would change every run.
        import re
        text = re.sub(r"'date': '[^']*'", "'date': '<date>'", text)
        first = text.splitlines()[0] if text else ""
        return {"error": type(e).__name__, "message": first[:300]}
    if kind == "text":
        return {"ok": str(r.text)}
    if r is None:
        return {"ok": None}
    return {"ok": r.model_dump(mode="json")}


def generate(provider, capture):
    from importlib.metadata import version
    from langchain_core.messages import HumanMessage, SystemMessage
    messages = [SystemMessage(SYSTEM), HumanMessage(USER)]
    requests, replies = [], []
    family = provider in compat().PROVIDERS
    capture.model = all_models()[provider]
    refused = {}
    for kind in KINDS:
        if provider == "huggingface" and kind != "text":
            # ChatHuggingFace.with_structured_output refuses a Pydantic model before any request.
            refused[kind] = outcome(kind, lambda: runnable_for(provider, kind, capture.url).invoke(messages), capture.url)
            continue
        seen = None
        for case in cases_for(kind) + cloud_error_cases(provider, kind):
            reply = reply_for(provider, kind, case)
            status, capture.reply_headers = cloud_error_status(provider, case)
            capture.status = status
            capture.reply = reply
            capture.requests.clear()
            runnable = runnable_for(provider, kind, capture.url)
            result = outcome(kind, lambda: runnable.invoke(messages), capture.url)
            # One request per call; ChatNVIDIA alone asks again when a structured reply does not
            # parse (as `guided_json`, then `nvext`: 3 requests in all): the call's `attempts`.
            attempts = len(capture.requests)
            assert attempts == 1 or provider == "nvidia", \
                (provider, kind, case, attempts, result)
            req = capture.requests[0]
            if seen is None:
                seen = req
                if family and kind != "text":
                    # The table's method is the one the package used: the replies answer in its shape.
                    asked = "function_calling" if "tools" in req["body"] else "json_schema"
                    assert asked == compat().method(provider), (provider, kind, asked)
                requests.append({"kind": kind, "schema": {"structured": STRUCTURED, "envelope": ENVELOPE}.get(kind),
                                 **({"tools": TOOLS} if kind == "decision" else {}),
                                 "method": req["method"], "path": req["path"], "headers": scrub_headers(req["headers"]),
                                 "body": stable_properties(req["body"]) if provider in CLOUD_MODELS else req["body"]})
            else:
                assert req["body"] == seen["body"], f"{provider}/{kind}: the request changed between replies"
            replies.append({"kind": kind, "case": case, "status": status, **({"headers": capture.reply_headers} if capture.reply_headers else {}),
                            "reply": reply, "langchain": result, **({"attempts": attempts} if attempts > 1 else {})})
    if family:
        # Error answers, without the SDKs' own retries (one request each): what the package raises.
        for case, (status, body) in compat().error_cases(provider).items():
            capture.reply, capture.status, capture.reply_headers = body, status, {}
            capture.requests.clear()
            runnable = compat().without_retries(provider, runnable_for(provider, "text", capture.url, **compat().no_retry_kwargs(provider)))
            result = outcome("text", lambda: runnable.invoke(messages), capture.url)
            assert len(capture.requests) == 1, (provider, case, len(capture.requests))
            replies.append({"kind": "text", "case": case, "status": status, "reply": body, "langchain": result})
    if provider in CLOUD_MODELS:
        recorded = cloud_recorded(provider)
    elif provider == "ibm":
        recorded = IBM_RECORDED
    else:
        recorded = RECORDED + (compat().recorded(provider) if family else [])
    extra = {"bearer_request": bedrock_bearer_request(provider, capture, messages)} if provider == "bedrock_converse" else {}
    if refused:
        extra = {"refused": refused}
    if provider == "ibm":
        # The IAM exchange of the API key (once: the SDK keeps the token), as IBM's SDK sends it.
        t = capture.token_requests[0]
        extra = {"token_request": {"method": t["method"], "path": t["path"], "form": t["form"].replace(API_KEY, KEY_PLACEHOLDER),
                                   "headers": {k: v for k, v in sorted(t["headers"].items()) if k in ("authorization", "content-type")}}}
    return {
        "generator": GENERATOR,
        "packages": {name: version(name) for name in recorded},
        "provider": provider,
        "model": all_models()[provider],
        "system": SYSTEM,
        "user": USER,
        "requests": requests,
        "replies": replies,
        **extra,
    }


def main():
    group = group_arg()
    if group == "main" and "--group" not in sys.argv and Path(sys.prefix).resolve() != venv_dir("main"):
        # The Vertex AI and IBM groups first, each in its own venv (see VERTEX_PINS, IBM_PINS); then this one.
        for other in ("vertex", "ibm"):
            names = [a for a in sys.argv[1:] if group_of(a) == other]
            if names or not sys.argv[1:]:
                subprocess.run([sys.executable, str(Path(__file__).resolve()), "--group", other, *names], check=True)
    ensure_venv(group)
    isolate_environment()
    cloud_environment()
    import logging
    import warnings
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)  # parsers log the exceptions they raise; the fixtures hold them
    capture = Capture()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    if group == "main":
        sign_vectors()
    # Some providers only (named after the options); all of them by default.
    args = sys.argv[1:]
    if "--group" in args:
        i = args.index("--group")
        args = args[:i] + args[i + 2:]
    only = args
    for provider in [p for p in all_models() if group_of(p) == group]:
        if only and provider not in only:
            continue
        fixture = generate(provider, capture)
        path = OUT_DIR / f"{provider}.json"
        path.write_text(json.dumps(fixture, ensure_ascii=False, indent=2) + "\n")
        failed = sum(1 for r in fixture["replies"] if "error" in r["langchain"])
        print(f"{path.relative_to(REPO)}: {len(fixture['requests'])} requests, {len(fixture['replies'])} replies "
              f"({failed} where LangChain raised)")
    capture.server.shutdown()


if __name__ == "__main__":
    main()
