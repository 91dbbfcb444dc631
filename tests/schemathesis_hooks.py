"""schemathesis hooks for tests/test_server.py::test_openapi_conformance (loaded through SCHEMATHESIS_HOOKS).

Before each call of a route that takes a body:
- a request that the schema allows is mended where it breaks a rule that JSON Schema cannot state, so that it is
  still a request the server must accept (each rule is written in the field's description, and tests/test_server.py's
  table of bad requests checks its 400): `top_logprobs` needs `logprobs`; `best_of >= n`; `min_tokens <= max_tokens`;
  no `best_of`, beam search or `prompt_logprobs` with `stream`; `stream_options` only with `stream`; beam
  search needs more than one sequence and no sampling knobs; logit_bias keys are token ids below the vocabulary size;
  `response_format` or `structured_outputs`, not both, and neither with beam search; a constraint must compile (a
  random regex, grammar or JSON schema seldom does), so a generated one becomes `json_object`; a `tool` message has a
  `tool_call_id` and no other has one, only an assistant message has `tool_calls`, and only one with calls may leave
  out `content`; `tool_choice` other than none needs tools, tool names are unique, a named choice names one of them;
  a forced call (required, named) has no other constraint, no beam search, and tools whose arguments are any object
  (their random schemas seldom compile).
- the same for /v1/responses (no `previous_response_id`: responses are not stored; `max_output_tokens` set; a generated `text.format` schema
  becomes `json_object`) and /tokenize (`prompt` or `messages`, one of the two; `tools` only with messages; messages
  mended as above).
- /v1/embeddings: a list of inputs is held to at most 8 of them (a shorter list is still valid), so that it is quick.
- `max_tokens`, `max_completion_tokens` and `max_output_tokens` are held to at most 8 whatever the mode, if they were
  valid, so that an accepted request is quick (a valid value stays valid: the mode of the case does not change).
"""
import schemathesis

CAP = 8
MAX_MODEL_LEN = 2048  # of the server under test: long enough for the prompts schemathesis makes
VOCAB = 49152  # SmolLM2's vocabulary
ROUTES = ('/v1/chat/completions', '/v1/completions')
COUNTS = ('max_tokens', 'max_completion_tokens', 'max_output_tokens')


def _valid_count(v) -> bool:
    "A token count the schema allows (an integer, or an integer-valued number) over CAP."
    integral = isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()
    return integral and CAP < v <= MAX_MODEL_LEN


def _mend(b: dict, chat: bool):
    if chat and b.get('top_logprobs') is not None:
        b['logprobs'] = True
    n = b.get('n') if b.get('n') is not None else 1
    if b.get('best_of') is not None and b['best_of'] < n:
        b['best_of'] = n
    budget = b.get('max_completion_tokens') if chat and b.get('max_completion_tokens') is not None else b.get('max_tokens')
    if budget is None:
        budget = CAP
        b['max_completion_tokens' if chat else 'max_tokens'] = CAP
    if (b.get('min_tokens') or 0) > budget:
        b['min_tokens'] = budget
    if b.get('stream'):
        b['best_of'], b['use_beam_search'], b['prompt_logprobs'] = None, False, None
    elif b.get('stream_options') is not None:
        b['stream_options'] = None
    if b.get('use_beam_search'):
        sampling = any(b.get(k) is not None for k in ('top_p', 'top_k', 'min_p')) or (b.get('temperature') or 0) > 0
        if sampling or max(n, b.get('best_of') or 1) < 2:
            b['use_beam_search'] = False
    rf = b.get('response_format')
    constrained = isinstance(b.get('structured_outputs'), dict) or isinstance(rf, dict) and rf.get('type') != 'text'
    if constrained:
        b['structured_outputs'] = None
        b['response_format'] = None if b.get('use_beam_search') else {'type': 'json_object'}
    if chat:
        _mend_tools(b)
    if isinstance(b.get('logit_bias'), dict):
        b['logit_bias'] = {k: v for k, v in b['logit_bias'].items() if int(k) < VOCAB}


def _mend_messages(b: dict):
    for m in b.get('messages') or []:
        if m.get('role') == 'tool' and m.get('tool_call_id') is None:
            m['tool_call_id'] = 'call_0'
        if m.get('role') != 'tool':
            m.pop('tool_call_id', None)
        if m.get('role') != 'assistant':
            m.pop('tool_calls', None)
        if m.get('content') is None and not (m.get('role') == 'assistant' and m.get('tool_calls')):
            m['content'] = ''


def _mend_tools(b: dict):
    _mend_messages(b)
    tools = b.get('tools')
    choice = b.get('tool_choice')
    if not tools:
        if choice not in (None, 'none'):
            b['tool_choice'] = None
        return
    b['tools'] = tools = list({t['function']['name']: t for t in tools}.values())
    if isinstance(choice, dict):
        choice['function']['name'] = tools[0]['function']['name']
    if choice == 'required' or isinstance(choice, dict):
        if b.get('use_beam_search'):
            b['tool_choice'] = 'none'
            return
        b['response_format'] = b['structured_outputs'] = None
        for t in tools:
            t['function']['parameters'] = None


def _mend_responses(b: dict):
    b['previous_response_id'] = None
    if b.get('max_output_tokens') is None:
        b['max_output_tokens'] = CAP
    fmt = (b.get('text') or {}).get('format')
    if isinstance(fmt, dict) and fmt.get('type') == 'json_schema':
        b['text']['format'] = {'type': 'json_object'}


def _mend_tokenize(b: dict):
    if b.get('messages') is None:
        b['tools'] = None
        b['prompt'] = b.get('prompt') if b.get('prompt') is not None else 'Hi'
    else:
        b['prompt'] = None
        _mend_messages(b)


@schemathesis.hook
def before_call(context, case, kwargs):
    if not isinstance(case.body, dict):
        return
    for key in COUNTS:
        if _valid_count(case.body.get(key)):
            case.body[key] = CAP
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return
    if case.path in ROUTES:
        _mend(case.body, chat=case.path == ROUTES[0])
    elif case.path == '/v1/responses':
        _mend_responses(case.body)
    elif case.path == '/tokenize':
        _mend_tokenize(case.body)
    elif case.path == '/v1/embeddings' and isinstance(case.body.get('input'), list) and len(case.body['input']) > CAP:
        case.body['input'] = case.body['input'][:CAP]
