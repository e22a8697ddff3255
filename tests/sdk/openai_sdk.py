"""The official openai Python SDK against zonegate (tests/providers.rs).

Usage: openai_sdk.py BASE_URL API_KEY MODEL
Prints one JSON object: a chat answer, a stream's text and usage (with
stream_options.include_usage), and a tool call, as the SDK parsed them.
"""

import json
import sys

from openai import OpenAI


def main() -> None:
    base_url, api_key, model = sys.argv[1:4]
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    chat = client.chat.completions.create(
        model=model,
        max_tokens=3,
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello"},
        ],
    )
    text, usage, finish = "", None, None
    stream = client.chat.completions.create(
        model=model,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hello"}],
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            if choice.delta.content:
                text += choice.delta.content
            if choice.finish_reason:
                finish = choice.finish_reason
    tools = client.chat.completions.create(
        model=model,
        max_tokens=2,
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                    },
                },
            }
        ],
        tool_choice={"type": "function", "function": {"name": "weather"}},
    )
    call = tools.choices[0].message.tool_calls
    print(
        json.dumps(
            {
                "chat": {
                    "content": chat.choices[0].message.content,
                    "finish_reason": chat.choices[0].finish_reason,
                    "usage": chat.usage.model_dump(),
                },
                "stream": {"text": text, "finish_reason": finish, "usage": usage},
                "tools": {
                    "finish_reason": tools.choices[0].finish_reason,
                    "name": call[0].function.name if call else None,
                    "arguments": json.loads(call[0].function.arguments) if call else None,
                },
            }
        )
    )


if __name__ == "__main__":
    main()
