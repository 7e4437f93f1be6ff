"""The official `openai` Python SDK, unchanged, against a gateway (driven by openai_sdk.rs).

Environment: OPENAI_BASE_URL (the gateway's /v1), MRT_KEY (tenant acme), MRT_OTHER_KEY (tenant
other), MRT_LIMITED_KEY (a tenant whose submit bucket holds one token), MRT_CASES (optional,
comma-separated subset), MRT_SECOND_BASE_URL (optional: another gateway of the same
deployment, for `resume_elsewhere`), MRT_TOOL_MODEL (optional: a model with tools behind the
local OpenAI-compatible provider fixture, for `tool_round_trip`). The mock model `model-alpha` streams "hello", " from", " mock";
`model-slow` streams ten chunks 200 ms apart; `model-stuck` waits a minute per chunk, so a
cancel always finds it running. Prints `ok <case>` per passing case and exits
non-zero at the first failure.
"""

import json
import os
import sys
import threading
import time

import openai
from openai import OpenAI

BASE = os.environ["OPENAI_BASE_URL"]
TEXT = "hello from mock"
client = OpenAI(base_url=BASE, api_key=os.environ["MRT_KEY"], max_retries=0, timeout=60)
other = OpenAI(base_url=BASE, api_key=os.environ["MRT_OTHER_KEY"], max_retries=0, timeout=60)


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def create_plain():
    r = client.responses.create(model="model-alpha", input="hi")
    check(r.status == "completed", f"status {r.status}")
    check(r.output_text == TEXT, f"text {r.output_text!r}")
    check(r.id.startswith("resp_"), r.id)
    check(r.usage.input_tokens == 1 and r.usage.output_tokens == 3, f"usage {r.usage}")
    check(r.usage.total_tokens == 4, f"usage {r.usage}")
    check(r.model == "model-alpha", r.model)


def create_stream():
    events = list(client.responses.create(model="model-alpha", input="hi", stream=True))
    numbers = [e.sequence_number for e in events]
    check(numbers == list(range(len(events))), f"numbers {numbers}")
    check(events[0].type == "response.created", events[0].type)
    check(events[-1].type == "response.completed", events[-1].type)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check(deltas == TEXT, f"deltas {deltas!r}")
    check(events[-1].response.output_text == TEXT, "final text")


def background():
    r = client.responses.create(model="model-slow", input="hi", background=True)
    check(r.status == "queued", f"status {r.status}")
    deadline = time.monotonic() + 60
    while r.status in ("queued", "in_progress"):
        check(time.monotonic() < deadline, "background response never finished")
        time.sleep(0.1)
        r = client.responses.retrieve(r.id)
    check(r.status == "completed", f"status {r.status}")
    check(r.output_text == "s " * 10, f"text {r.output_text!r}")


def resume():
    first = list(client.responses.create(model="model-alpha", input="hi", stream=True))
    rid = first[0].response.id
    for after in (0, 3, len(first) - 2):
        resumed = list(client.responses.retrieve(rid, stream=True, starting_after=after))
        want = [e.to_dict() for e in first[after + 1:]]
        got = [e.to_dict() for e in resumed]
        check(got == want, f"after {after}: {[e['sequence_number'] for e in got]}")
    check(list(client.responses.retrieve(rid, stream=True, starting_after=len(first) - 1)) == [],
          "nothing after the last event")


def stream_helper():
    with client.responses.stream(model="model-alpha", input="hi") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    check(final.output_text == TEXT, f"text {final.output_text!r}")


def cancel():
    r = client.responses.create(model="model-stuck", input="hi", background=True)
    cancelled = client.responses.cancel(r.id)
    check(cancelled.status == "cancelled", f"status {cancelled.status}")
    again = client.responses.cancel(r.id)
    check(again.status == "cancelled", f"second cancel {again.status}")
    check(client.responses.retrieve(r.id).status == "cancelled", "retrieve after cancel")


def chat():
    c = client.chat.completions.create(model="model-alpha", messages=[{"role": "user", "content": "hi"}])
    check(c.object == "chat.completion", c.object)
    check(c.choices[0].message.content == TEXT, c.choices[0].message.content)
    check(c.choices[0].finish_reason == "stop", c.choices[0].finish_reason)
    check(c.usage.total_tokens == 4, f"usage {c.usage}")
    chunks = list(client.chat.completions.create(
        model="model-alpha", messages=[{"role": "user", "content": "hi"}],
        stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(text == TEXT, f"streamed {text!r}")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3, "usage chunk")
    check(any(ch.choices and ch.choices[0].finish_reason == "stop" for ch in chunks), "finish")
    plain = list(client.chat.completions.create(
        model="model-alpha", messages=[{"role": "user", "content": "hi"}], stream=True))
    check(all(ch.usage is None for ch in plain), "no usage chunk unless asked")


def models():
    ids = [m.id for m in client.models.list()]
    check("model-alpha" in ids and "model-slow" in ids, f"models {ids}")
    m = client.models.retrieve("model-alpha")
    check((m.id, m.object, m.owned_by) == ("model-alpha", "model", "provider-mock"), f"model {m}")
    try:
        client.models.retrieve("model-unknown")
        check(False, "an unknown model must be 404")
    except openai.NotFoundError as e:
        check(e.code == "model_not_found", f"code {e.code}")


def chat_cancelled():
    # The SDK's own retries on (default max_retries): a cancelled chat completion must not be
    # run again. The chat and a background Response share an Idempotency-Key, so they are one
    # execution (whichever comes first creates it), which the Response's id then cancels.
    posts = []
    counting = OpenAI(base_url=BASE, api_key=os.environ["MRT_KEY"], timeout=60,
                      http_client=openai.DefaultHttpxClient(event_hooks={"request": [
                          lambda request: posts.append(request.url.path)]}))
    key = {"Idempotency-Key": f"sdk-chat-cancel-{time.time_ns()}"}
    outcome = {}

    def chat_call():
        try:
            counting.chat.completions.create(
                model="model-stuck", messages=[{"role": "user", "content": "hi"}], extra_headers=key)
        except openai.APIStatusError as e:
            outcome["error"] = e

    caller = threading.Thread(target=chat_call)
    caller.start()
    started = time.time()
    while not posts and time.time() - started < 30:
        time.sleep(0.05)
    r = client.responses.create(model="model-stuck", input="hi", background=True, extra_headers=key)
    check(client.responses.cancel(r.id).status == "cancelled", "cancel")
    caller.join(60)
    error = outcome.get("error")
    check(isinstance(error, openai.ConflictError), f"answer {error!r}")
    check(error.response.headers.get("x-should-retry") == "false", "x-should-retry")
    check(posts == ["/v1/chat/completions"], f"requests {posts}")


def idempotency():
    headers = {"Idempotency-Key": f"sdk-{time.time_ns()}"}
    a = client.responses.create(model="model-alpha", input="hi", extra_headers=headers)
    b = client.responses.create(model="model-alpha", input="hi", extra_headers=headers)
    check(a.id == b.id, "one execution per key")
    try:
        client.responses.create(model="model-alpha", input="other", extra_headers=headers)
        check(False, "a different request with the key must fail")
    except openai.UnprocessableEntityError as e:
        check(e.status_code == 422, str(e.status_code))


def errors():
    anonymous = OpenAI(base_url=BASE, api_key="not-a-key", max_retries=0)
    try:
        anonymous.models.list()
        check(False, "no key must be refused")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, str(e.status_code))
    r = client.responses.create(model="model-alpha", input="hi")
    try:
        other.responses.retrieve(r.id)
        check(False, "another tenant's response must be hidden")
    except openai.NotFoundError as e:
        check(e.body["code"] == "not_found", str(e.body))
    try:
        client.responses.create(model="no-such-model", input="hi")
        check(False, "unknown model")
    except openai.NotFoundError as e:
        check(e.body["code"] == "model_not_found", str(e.body))
    try:
        client.responses.create(model="model-alpha", input="hi", previous_response_id=r.id)
        check(False, "previous_response_id is not supported")
    except openai.BadRequestError as e:
        check(e.body["param"] == "previous_response_id", str(e.body))
        check(r.id not in str(e.body), "the error echoes nothing")
    limited = OpenAI(base_url=BASE, api_key=os.environ["MRT_LIMITED_KEY"], max_retries=0)
    limited.responses.create(model="model-alpha", input="hi")
    try:
        limited.responses.create(model="model-alpha", input="hi")
        check(False, "the second submit must exceed the quota")
    except openai.RateLimitError as e:
        check(e.response.headers.get("retry-after") is not None, "retry-after")


def resume_elsewhere():
    """A stream dropped on one gateway resumes on another with exactly the events after N."""
    second = os.environ.get("MRT_SECOND_BASE_URL")
    if not second:
        return "skipped"
    elsewhere = OpenAI(base_url=second, api_key=os.environ["MRT_KEY"], max_retries=0, timeout=60)
    stream = client.responses.create(model="model-slow", input="hi", stream=True)
    seen = []
    for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    stream.close()
    rid = seen[0].response.id
    after = seen[-1].sequence_number
    resumed = list(elsewhere.responses.retrieve(rid, stream=True, starting_after=after))
    numbers = [e.sequence_number for e in resumed]
    check(numbers == list(range(after + 1, after + 1 + len(resumed))), f"numbers {numbers}")
    check(resumed[-1].type == "response.completed", resumed[-1].type)
    whole = list(client.responses.retrieve(rid, stream=True))
    check([e.to_dict() for e in whole[: after + 1]] == [e.to_dict() for e in seen], "same prefix")
    check([e.to_dict() for e in whole[after + 1:]] == [e.to_dict() for e in resumed], "same tail")
    text = "".join(e.delta for e in seen + resumed if e.type == "response.output_text.delta")
    check(text == "s " * 10, f"text {text!r}")


WEATHER = {"type": "object", "properties": {"location": {"type": "string"}}}


def tool_round_trip():
    """A function call and its output through both APIs, against the provider fixture, which
    calls `get_weather` until it is given the tool's output, then answers with text."""
    model = os.environ.get("MRT_TOOL_MODEL")
    if not model:
        return "skipped"
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    r = client.responses.create(model=model, input="Weather in Paris?", tools=tools)
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) == 1 and calls[0].name == "get_weather", f"calls {r.output}")
    check(json.loads(calls[0].arguments) == {"location": "Paris"}, calls[0].arguments)
    follow = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
    ]
    r = client.responses.create(model=model, input=follow, tools=tools)
    check(r.output_text == "It is sunny in Paris.", f"text {r.output_text!r}")

    chat_tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    c = client.chat.completions.create(model=model, messages=messages, tools=chat_tools)
    check(c.choices[0].finish_reason == "tool_calls", c.choices[0].finish_reason)
    call = c.choices[0].message.tool_calls[0]
    check(call.function.name == "get_weather", call.function.name)
    streamed = list(client.chat.completions.create(
        model=model, messages=messages, tools=chat_tools, stream=True))
    fragments = "".join(
        tc.function.arguments or "" for ch in streamed if ch.choices
        for tc in (ch.choices[0].delta.tool_calls or []) if tc.index == 0)
    check(json.loads(fragments) == {"location": "Paris"}, f"fragments {fragments!r}")
    messages += [c.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    c = client.chat.completions.create(model=model, messages=messages, tools=chat_tools)
    check(c.choices[0].message.content == "It is sunny in Paris.", c.choices[0].message.content)


CASES = [create_plain, create_stream, background, resume, stream_helper, cancel, chat, models,
         chat_cancelled, idempotency, errors, resume_elsewhere, tool_round_trip]

if __name__ == "__main__":
    wanted = os.environ.get("MRT_CASES")
    for case in CASES:
        if wanted and case.__name__ not in wanted.split(","):
            continue
        try:
            outcome = case()
        except Exception as e:  # noqa: BLE001 - report which case failed, then fail
            print(f"FAILED {case.__name__}: {type(e).__name__}: {e}", flush=True)
            sys.exit(1)
        print(f"{outcome or 'ok'} {case.__name__}", flush=True)
    print(f"openai {openai.__version__}", flush=True)
