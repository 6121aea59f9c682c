"""OpenAI chat/completions request handling (SIMULATED stand-in of the serving module).

Validation follows vLLM's errors (unknown model 404; context too long, bad JSON, auto tool choice
without --enable-auto-tool-choice 400). The answers come from vllm._sim.textgen.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass

from vllm._sim import textgen
from vllm._sim.metrics import spec_for

# Genesis anchors (the stand-in Genesis replaces each line with its marker):
# [anchor P12]
# [anchor P15]
# [anchor P27]
# [anchor P29]
# [anchor P61]
# [anchor P61B]
# [anchor P64]
# [anchor P68]
# [anchor P69]


@dataclass
class Stream:
    chunks: list[dict]
    broken: bool = False  # fault broken-sse: cut off mid-event, empty deltas, no [DONE]


def error(
    status: int, message: str, kind: str = "BadRequestError", param: str | None = None
) -> tuple[int, dict]:
    return status, {"error": {"message": message, "type": kind, "param": param, "code": status}}


def _max_tokens(
    body: dict, prompt_tokens: int, max_model_len: int
) -> tuple[int | None, tuple[int, dict] | None]:
    requested = body.get("max_completion_tokens", body.get("max_tokens"))
    if requested is not None and (not isinstance(requested, int) or requested < 1):
        return None, error(400, f"max_tokens must be at least 1, got {requested}.", param="max_tokens")
    if prompt_tokens >= max_model_len or (
        requested is not None and prompt_tokens + requested > max_model_len
    ):
        wanted = requested or 0
        return None, error(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + wanted} tokens ({prompt_tokens} in the messages, {wanted} in the completion). "
            "Please reduce the length of the messages or completion.",
        )
    return (requested if requested is not None else max_model_len - prompt_tokens), None


def handle_chat(engine, body: dict) -> tuple[int, dict | Stream]:
    cfg = engine.config
    model = body.get("model") or cfg.served_model_names[0]
    if model not in cfg.served_model_names:
        return error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return error(400, "messages must be a non-empty list of message objects", param="messages")
    tools = body.get("tools") or None
    tool_choice = body.get("tool_choice", "auto" if tools else "none")
    if tools and tool_choice == "auto" and not (cfg.enable_auto_tool_choice and cfg.tool_call_parser):
        return error(
            400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    prompt_tokens = textgen.count_prompt_tokens(messages)
    max_tokens, problem = _max_tokens(body, prompt_tokens, cfg.max_model_len)
    if problem:
        return problem
    assert max_tokens is not None
    kwargs = dict(cfg.default_chat_template_kwargs)
    kwargs.update(body.get("chat_template_kwargs") or {})
    thinking = bool(kwargs.get("enable_thinking", False)) if "enable_thinking" in kwargs else False
    reply = textgen.healthy(
        messages,
        max_tokens=max_tokens,
        tools=tools,
        tool_choice=tool_choice,
        thinking=thinking,
        reasoning_parser=cfg.reasoning_parser,
    )
    n = engine.degrade.count()
    if engine.garbage or engine.degrade.late():
        reply = textgen.garbage(
            messages, max_tokens=max_tokens, prompt_tokens=prompt_tokens, healthy_reply=reply
        )
    users = [m for m in messages if m.get("role") == "user"]
    reply = engine.degrade.reply(reply, textgen.message_text(users[-1]) if users else "", n)
    prompt_text = "\n".join(textgen.message_text(m) for m in messages)
    engine.finish(prompt_text, prompt_tokens, reply)
    rid = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())
    message: dict = {
        "role": "assistant",
        "content": reply.content,
        "tool_calls": reply.tool_calls,
        "refusal": None,
    }
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
        message["reasoning"] = reply.reasoning
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + reply.completion_tokens,
        "completion_tokens": reply.completion_tokens,
        "prompt_tokens_details": None,
    }
    base = {"id": rid, "created": created, "model": model, "system_fingerprint": engine.fingerprint}
    if body.get("stream"):
        chunks = _chat_chunks(base, reply, usage, body)
        if engine.degrade.broken_stream():
            return 200, Stream(chunks[: max(1, len(chunks) // 2)], broken=True)
        return 200, Stream(chunks)
    return 200, {
        **base,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": reply.finish_reason,
                "stop_reason": None,
            }
        ],
        "usage": usage,
        "prompt_logprobs": None,
    }


def _chat_chunks(base: dict, reply: textgen.Reply, usage: dict, body: dict) -> list[dict]:
    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {
            **base,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    if reply.reasoning:
        chunks += [chunk({"reasoning_content": p}) for p in textgen.pieces(reply.reasoning)]
    for i, call in enumerate(reply.tool_calls):
        chunks.append(chunk({"tool_calls": [{"index": i, **call}]}))
    chunks += [chunk({"content": p}) for p in textgen.pieces(reply.content or "")]
    chunks.append(chunk({}, reply.finish_reason))
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
    return chunks


def handle_completion(engine, body: dict) -> tuple[int, dict | Stream]:
    cfg = engine.config
    model = body.get("model") or cfg.served_model_names[0]
    if model not in cfg.served_model_names:
        return error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt and isinstance(prompt[0], str) else None
    if not isinstance(prompt, str):
        return error(400, "prompt must be a string", param="prompt")
    messages = [{"role": "user", "content": prompt}]
    prompt_tokens = (len(prompt) + 3) // 4
    requested = body.get("max_tokens", 16)
    max_tokens, problem = _max_tokens({"max_tokens": requested}, prompt_tokens, cfg.max_model_len)
    if problem:
        return problem
    assert max_tokens is not None
    reply = textgen.healthy(messages, max_tokens=max_tokens)
    if engine.garbage:
        reply = textgen.garbage(
            messages, max_tokens=max_tokens, prompt_tokens=prompt_tokens, healthy_reply=reply
        )
    engine.finish(prompt, prompt_tokens, reply)
    base = {
        "id": "cmpl-" + uuid.uuid4().hex,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": engine.fingerprint,
    }
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + reply.completion_tokens,
        "completion_tokens": reply.completion_tokens,
        "prompt_tokens_details": None,
    }
    return 200, {
        **base,
        "object": "text_completion",
        "choices": [
            {
                "index": 0,
                "text": reply.content or "",
                "logprobs": None,
                "finish_reason": reply.finish_reason,
                "stop_reason": None,
            }
        ],
        "usage": usage,
    }


def spec_mode(engine, reply: textgen.Reply) -> str:
    if not (engine.garbage or engine.degrade.late()):
        return engine.degrade.spec_mode("healthy")
    return "full" if engine.garbage_full_acceptance else "garbage"


def spec_step(engine, reply: textgen.Reply):
    if not engine.config.num_spec_tokens:
        return None
    return spec_for(reply.completion_tokens, engine.config.num_spec_tokens, spec_mode(engine, reply))


def fingerprint(version: str) -> str:
    return "vllm-" + hashlib.sha256(version.encode()).hexdigest()[:8] + "-simulated"
