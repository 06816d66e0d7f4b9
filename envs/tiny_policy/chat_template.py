"""Model stage (offline default policy): the ChatML chat template saved with the tokenizer.

Kept as Python source, not a data file, so it ships with the package under any packaging.
Tools render as JSON schemas in a system block, assistant tool calls as
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, and each tool message as
its own user turn wrapped in `<tool_response>` tags.

`THINK_CHAT_TEMPLATE`, of the thinking variant, is the same template except that it drops the
`<think>...</think>` reasoning of assistant turns before the last user message, as Qwen3's
template does; it therefore rewrites history, and an episode that retries after feedback trains
as several samples.
"""

CHAT_TEMPLATE = r"""{#- ChatML. Every turn renders from its own message only, so rendering messages[:k] is a string
    prefix of rendering messages[:k+1]: tool messages are one user turn each, never merged. -#}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\nYou can call these functions, given as JSON schemas:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\nTo call one, reply with <tool_call>\n{"name": <name>, "arguments": <json object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- raise_exception('Only the first message may have role system.') }}
        {%- endif %}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {%- if message.content or not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


# The thinking variant: the ChatML template above with each assistant message's text taken from
# `content`, which loses its reasoning before the last user message (a Qwen3-style rewrite).
_CONTENT = """        {%- if message.content %}
            {{- message.content }}
        {%- endif %}"""
_CONTENT_WITHOUT_EARLIER_REASONING = """        {%- set content = message.content or '' %}
        {%- if loop.index0 < history.last_user and '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if content %}
            {{- content }}
        {%- endif %}"""
_LAST_USER_INDEX = """{%- set history = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- set history.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
"""
assert _CONTENT in CHAT_TEMPLATE
THINK_CHAT_TEMPLATE = _LAST_USER_INDEX + CHAT_TEMPLATE.replace(
    _CONTENT, _CONTENT_WITHOUT_EARLIER_REASONING
).replace("{%- if message.content or not loop.first %}", "{%- if content or not loop.first %}")
