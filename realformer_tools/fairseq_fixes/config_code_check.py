"""Python hidden in a checkpoint's config strings, refused before fairseq ``eval()``s it.

Not a patch of its own: ``safe_checkpoint_loading`` runs ``refuse_code_in_config`` on every
checkpoint it loaded (threat 4 of its threat model). The unpickler cannot see this one: the
strings are plain data, but fairseq builds models, tasks and optimizers by calling
``eval()`` on some of the checkpoint's own config fields (``utils.eval_str_list`` on
``adaptive_softmax_cutoff`` in ``TransformerDecoder``, ``eval_str_dict`` on
``xformers_att_config``, ``eval(args.encoder_layers)`` in fconv, ...).
"""

import argparse
import ast
import builtins

from omegaconf import OmegaConf

from realformer_nmt.errors import UnsafeCheckpointError

# Legitimate values of the fields fairseq 0.12 passes to eval() (directly or through
# utils.eval_str_list / eval_str_dict / eval_bool) are literals ("(0.9, 0.98)", "[(512, 10,
# 5)] + [(512, 3, 2)] * 4"), and an expression can do nothing without a call: in those
# fields any call is refused. In every other field (paths and names, which may well read
# "runs (old)") only what an attack needs: dunder names, calls of builtins or of attributes.

_EVALUATED_FIELDS = frozenset(
    """adafactor_eps adam_betas adamax_betas adaptive_input_cutoff adaptive_softmax_cutoff
    character_filters conv_aggregator_layers conv_dec_config conv_feature_layers
    conv_layers decoder_attention decoder_layers decoder_zero_init downsample
    encoder_attention encoder_layers feature_encoder_spec gated_attention input_layers
    lamb_betas left_pad_source left_pad_target model_overrides pipeline_balance
    pipeline_decoder_balance pipeline_decoder_devices pipeline_devices
    pipeline_encoder_balance pipeline_encoder_devices pretrained project_input
    self_attention transformer_context transformer_dec_config transformer_enc_config
    transformer_sampling vggblock_enc_config wer_args xformers_att_config""".split()
)


def _holds_code(text, evaluated=True):
    """Whether ``text``, given to eval(), could do something (see above)."""
    text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
    if "(" not in text and "__" not in text:  # no call, no dunder possible
        return False
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False  # eval() cannot run it either
    for node in ast.walk(tree):
        if getattr(node, "id", "").startswith("__") or getattr(node, "attr", "").startswith("__"):
            return True
        if isinstance(node, ast.Call) and (evaluated or not isinstance(node.func, ast.Name)
                                           or node.func.id in vars(builtins)):
            return True
    return False


def _config_strings(obj, where, field, seen, depth=0):
    """(dotted key, field name, text) for every string in a config; runs no resolvers."""
    if isinstance(obj, (str, bytes)):
        yield where, field, obj
        return
    if depth > 64 or id(obj) in seen:  # pickles can be self-referential
        return
    seen.add(id(obj))
    obj = OmegaConf.to_container(obj, resolve=False) if OmegaConf.is_config(obj) else obj
    obj = vars(obj) if isinstance(obj, argparse.Namespace) else obj
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _config_strings(value, f"{where}.{key}", key, seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _config_strings(value, f"{where}[{i}]", field, seen, depth + 1)


def refuse_code_in_config(path, state):
    """Raise ``UnsafeCheckpointError`` naming the first config field of ``state`` that holds code."""
    for top in ("cfg", "args") if isinstance(state, dict) else ():
        for where, field, text in _config_strings(state.get(top), top, top, set()):
            evaluated = field in _EVALUATED_FIELDS
            if _holds_code(text, evaluated):
                snippet = text if len(text) <= 60 else text[:57] + "..."
                runs = ("fairseq would run with eval() when building the model" if evaluated
                        else "would run wherever that field is given to eval()")
                raise UnsafeCheckpointError(
                    f"refused to load checkpoint {path}: its config field {where} holds Python code "
                    f"({snippet!r}), which fairseq checkpoints never contain and which {runs}")
