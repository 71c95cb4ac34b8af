"""One sample's episode, as its page shows it: prompt, completion, each trace's messages.

Both sources hand over the v0 sample row (the platform stores it; a journal's
episode is projected into it by the SDK's own projection), whose
``info.native_wrapper`` is the whole episode record. The messages of a trace
are its root-to-leaf path through the message tree, as the projection walks
it, so the page shows what the platform's viewer would. Documents are user
content: every field is checked for its type, never trusted.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from ...projection import trace_to_sample
from ..traces_extract import as_list, as_object, number
from .rows import sample_row


@dataclass(frozen=True)
class Message:
    role: str
    text: str


@dataclass(frozen=True)
class TraceView:
    id: str | None
    agent: str | None
    reward: float | None
    messages: list[Message]


@dataclass(frozen=True)
class EpisodeView:
    sample_id: str | None
    episode_id: str | None
    prompt: str
    completion: str
    reward: float | None
    metrics: dict[str, float | None]
    error: str | None
    traces: list[TraceView] = field(default_factory=list)
    #: The task's ground truth as the record holds it (its ``answer``), as text.
    answer: str | None = None
    task: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


def content_text(content: Any) -> str:
    """A message's content as text: strings as they are, text parts joined,
    any other part as its JSON (an image part is named, not inlined)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    parts = []
    for part in as_list(content):
        part_obj = as_object(part)
        if isinstance(part_obj.get("text"), str):
            parts.append(part_obj["text"])
        else:
            parts.append(json.dumps(part, ensure_ascii=False, sort_keys=True))
    return "\n".join(parts) if isinstance(content, list) else json.dumps(content)


def _pretty_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1, sort_keys=True)


def tool_call_text(call: Any) -> str:
    """One tool call as ``[tool call] NAME ARGUMENTS``. The arguments arrive as
    JSON text (OpenAI's shape): shown as the JSON they hold, not as a string
    with every quote escaped; text that is not JSON is shown as it is."""
    call_obj = as_object(call)
    function = as_object(call_obj.get("function"))
    if not function:
        return f"[tool call] {_pretty_json(call)}"
    name = function.get("name")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        # Not JSON, or nested past what a page shows: shown as the text it is.
        with contextlib.suppress(ValueError, RecursionError):
            arguments = json.loads(arguments)
    shown = arguments if isinstance(arguments, str) else _pretty_json(arguments)
    return f"[tool call] {name if isinstance(name, str) else _pretty_json(name)} {shown}"


def message_of(value: Any) -> Message:
    message = as_object(value)
    text = content_text(message.get("content"))
    calls = "\n".join(tool_call_text(c) for c in as_list(message.get("tool_calls")))
    if calls:
        text = f"{text}\n{calls}" if text else calls
    role = message.get("role")
    return Message(role=role if isinstance(role, str) else "?", text=text)


def _trace_view(trace: Any) -> TraceView:
    trace_obj = as_object(trace)
    try:
        sample = trace_to_sample(trace_obj)
    except (TypeError, KeyError, AttributeError, ValueError):
        # A malformed trace still shows its id rather than failing the page.
        sample = {"completion": [], "reward": None, "agent": None}
    agent = sample.get("agent")
    return TraceView(
        id=trace_obj.get("id") if isinstance(trace_obj.get("id"), str) else None,
        agent=agent if isinstance(agent, str) else None,
        reward=number(sample.get("reward")),
        messages=[message_of(m) for m in as_list(sample.get("completion"))],
    )


def _split(messages: list[Message]) -> tuple[str, str]:
    """Prompt: the messages before the first assistant turn; completion: the rest."""
    first = next((i for i, m in enumerate(messages) if m.role == "assistant"), len(messages))
    prompt = "\n\n".join(m.text for m in messages[:first])
    completion = "\n\n".join(m.text for m in messages[first:])
    return prompt, completion


#: Where a task's ground truth may be, in order: the v0 row's ``answer`` (the
#: projection copies the task data's), then the task data's own keys.
GROUND_TRUTH_KEYS = ("answer", "ground_truth", "solution", "target", "expected_output")


def ground_truth(sample: dict[str, Any]) -> str | None:
    """The ground truth a sample's record holds, as text; None if it holds none."""
    task = as_object(sample.get("task"))
    for value in [sample.get("answer"), *(task.get(k) for k in GROUND_TRUTH_KEYS)]:
        if value is None or value == "":
            continue
        if isinstance(value, str):
            return value
        return json.dumps(value, ensure_ascii=False, indent=1, sort_keys=True, default=str)
    return None


def episode_view(sample: dict[str, Any]) -> EpisodeView:
    """The episode page of one v0 sample row."""
    info = as_object(sample.get("info"))
    record = as_object(info.get("native_wrapper"))
    traces = [_trace_view(t) for t in as_list(record.get("traces"))]
    own = [message_of(m) for m in as_list(sample.get("completion"))]
    prompt, completion = _split(own)
    task_prompt = as_object(sample.get("task")).get("prompt")
    if isinstance(task_prompt, str) and not prompt:
        prompt = task_prompt
    row = sample_row(0, sample)  # the table's figures, so the page and its row agree
    sample_id, episode_id = sample.get("sample_id"), sample.get("episode_id")
    metrics = {str(k): number(v) for k, v in as_object(sample.get("metrics")).items()}
    return EpisodeView(
        sample_id=None if sample_id is None else str(sample_id),
        episode_id=None if episode_id is None else str(episode_id),
        prompt=prompt,
        completion=completion,
        reward=number(sample.get("reward")),
        metrics=metrics,
        error=row.error,
        traces=traces,
        answer=ground_truth(sample),
        task=row.task,
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
    )
