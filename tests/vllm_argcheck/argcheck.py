"""vLLM's own `vllm serve` argument checks as a long-lived process (test support).

Run with the vLLM venv's Python (scripts/install-vllm.sh) and
`VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1`: no GPU, no model files, no network.
vLLM's import takes seconds, so one process answers every request.

Protocol: one JSON request per line on stdin, one JSON answer per line on stdout.

  {"argv": ["serve", "<model>", ...], "env": {"VLLM_X": "1"}}
      argv as payload would exec it, without the program (also the
      `["-m", "vllm.entrypoints.openai.api_server", "--model", ...]` form);
      env: the engine's environment (optional).
      -> {"ok": true, "env_error": null|"...", "warnings": [...]}
      -> {"ok": false, "stage": "parse|validate|engine_args|api_server",
          "exit_code": 2|1, "error": "<what vLLM prints>", "env_error": ..., "warnings": [...]}
      `ok` is the argv's verdict; `env_error` the environment's, checked either way.
  {"options": true}
      -> {"options": [{"strings": [...], "dest": "...", "kind": "flag|bool|value",
          "nargs": null|"?"|"+"|"*"|N, "choices": [...]|null}, ...],
          "tool_parsers": [...], "reasoning_parsers": [...], "version": "0.33.0"}

The checks are the ones `vllm serve` runs before it loads a model, in its order
(vllm/entrypoints/cli/main.py, cli/serve.py, launchers/launcher.py setup_server):
the CLI parser (FlexibleArgumentParser with the serve subcommand from
make_arg_parser), validate_parsed_serve_args, AsyncEngineArgs.from_cli_args,
the structured-outputs config (which carries --reasoning-parser),
init_parser_plugin and validate_api_server_args (tool and reasoning parser
names). Environment names are checked with vLLM's own
Platform.validate_environ against vllm.envs: an unknown VLLM_* name is a
warning in vLLM (an error with --fail-on-environ-validation) and does nothing,
so it is reported as rejected.
"""

import argparse
import atexit
import contextlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import traceback


# vLLM's logger writes to stdout, which carries our answers.
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
# With HF_HUB_OFFLINE, EngineArgs resolves the model id in the Hugging Face cache, as on a compute
# node after the pre-download. A private cache holds an empty snapshot per model id checked (see
# _pretend_downloaded); it must be chosen before huggingface_hub is imported.
HF_HOME = tempfile.mkdtemp(prefix="vllm-argcheck-hf-")
atexit.register(shutil.rmtree, HF_HOME, True)
os.environ["HF_HOME"] = HF_HOME
os.environ.pop("HF_HUB_CACHE", None)

import vllm.platforms  # noqa: E402

# vLLM before 0.18 (0.16.0, the team's otagent) does not take VLLM_TARGET_DEVICE=cpu at run time:
# on a host without a GPU it finds no platform and its parser refuses to build. It gets the CPU
# platform the newer vLLM picks here, so both versions parse on the same platform.
if not vllm.platforms.current_platform.device_type:
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms.current_platform = CpuPlatform()

from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.entrypoints.cli.serve import ServeSubcommand  # noqa: E402
from vllm.reasoning import ReasoningParserManager  # noqa: E402
from vllm.tool_parsers import ToolParserManager  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

try:
    from vllm.entrypoints.common.cli_args import (  # noqa: E402
        init_parser_plugin,
        make_arg_parser,
        validate_api_server_args,
        validate_parsed_serve_args,
    )
except ImportError:  # vLLM 0.16.0: the same checks under openai/, plugins loaded in setup_server
    from vllm.entrypoints.openai.api_server import validate_api_server_args  # noqa: E402
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args  # noqa: E402

    def init_parser_plugin(args):
        """What vLLM 0.16.0's setup_server does before validate_api_server_args."""
        if args.tool_parser_plugin and len(args.tool_parser_plugin) > 3:
            ToolParserManager.import_tool_parser(args.tool_parser_plugin)
        if args.reasoning_parser_plugin and len(args.reasoning_parser_plugin) > 3:
            ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class _Collect(logging.Handler):
    """Collects vLLM's warnings (deprecated arguments, unknown env names)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


COLLECT = _Collect()
logging.getLogger().addHandler(COLLECT)
logging.getLogger().setLevel(logging.WARNING)


def cli_parser():
    """The parser `vllm` builds (vllm/entrypoints/cli/main.py main), with every subcommand, so its
    usage and errors are the real CLI's. Returns it and the serve subcommand."""
    import importlib

    # main.py's list, in its order; an older vLLM (0.16.0) has only some of them.
    names = ["openai", "serve", "launch", "benchmark.main", "collect_env", "download_kernels", "preload", "run_batch", "snapshot"]
    cmd_modules = [
        importlib.import_module(f"vllm.entrypoints.cli.{name}")
        for name in names
        if importlib.util.find_spec(f"vllm.entrypoints.cli.{name.split('.')[0]}") is not None
    ]
    snapshot = sys.modules.get("vllm.entrypoints.cli.snapshot")
    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    parser.add_argument("-v", "--version", action="version", version=importlib.metadata.version("vllm"))
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = None
    for module in cmd_modules:
        if snapshot is not None and module is snapshot:
            new_cmds = module.cmd_init(create_requested=False)
        else:
            new_cmds = module.cmd_init()
        for cmd in new_cmds:
            cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
            if isinstance(cmd, ServeSubcommand):
                serve = cmd
    return parser, serve


def module_parser():
    """The parser of `python -m vllm.entrypoints.openai.api_server` (launchers/api_server/entry.py main)."""
    parser = FlexibleArgumentParser(prog="api_server.py", description="vLLM OpenAI-Compatible RESTful API server.")
    return make_arg_parser(parser)


def _parse(parser, argv):
    """parse_args, turning argparse's exit into vLLM's printed error."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return parser.parse_args(argv), None
        except SystemExit as exc:
            return None, (exc.code if isinstance(exc.code, int) else 2, err.getvalue().strip())


def _exception_text(exc):
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def check(argv, env):
    COLLECT.messages.clear()
    answer, engine_args = _check(argv)
    warnings = list(COLLECT.messages)
    hard_fail = bool(getattr(engine_args, "fail_on_environ_validation", False))
    answer["env_error"] = _check_env(env or {}, hard_fail)
    answer["warnings"] = warnings
    return answer


def _failure(stage, exit_code, error):
    return {"ok": False, "stage": stage, "exit_code": exit_code, "error": error}, None


def _check(argv):
    """(verdict, EngineArgs or None) for one argv."""
    if argv[:1] == ["serve"]:
        parser, subcommand = cli_parser()
        stage_args = argv
    elif argv[:2] == ["-m", API_SERVER_MODULE]:
        if importlib.util.find_spec(API_SERVER_MODULE) is None:
            return _failure("parse", 1, f"No module named {API_SERVER_MODULE}")
        parser, subcommand = module_parser(), None
        stage_args = argv[2:]
    else:
        return _failure("parse", 2, f"not a vllm serve argv: {argv[:2]}")
    try:
        args, failed = _parse(parser, stage_args)
    except Exception as exc:  # FlexibleArgumentParser raises ValueError for some misuses
        return _failure("parse", 1, _exception_text(exc))
    if failed:
        code, text = failed
        return _failure("parse", code, text)
    if subcommand is not None:
        # ServeSubcommand.cmd: the positional model wins.
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
    try:
        validate_parsed_serve_args(args)
    except Exception as exc:
        return _failure("validate", 1, _exception_text(exc))
    for model in (args.model, args.tokenizer):
        _pretend_downloaded(model)
    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
        # What create_engine_config does with --reasoning-parser before anything reads it (0.16.0
        # has no such step).
        if hasattr(engine_args, "create_structured_outputs_config"):
            engine_args.create_structured_outputs_config()
    except Exception as exc:
        return _failure("engine_args", 1, _exception_text(exc))
    try:
        init_parser_plugin(args)
        validate_api_server_args(args)
    except Exception as exc:
        return _failure("api_server", 1, _exception_text(exc))
    return {"ok": True}, engine_args


def _pretend_downloaded(model):
    """An empty snapshot of `model` in the private HF cache: what a pre-downloaded model looks
    like to EngineArgs' offline lookup (its files are never read here)."""
    if not model or os.path.exists(model) or model.count("/") != 1:
        return
    repo = os.path.join(HF_HOME, "hub", "models--" + model.replace("/", "--"))
    revision = "0" * 40
    os.makedirs(os.path.join(repo, "snapshots", revision), exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as ref:
        ref.write(revision)


def _check_env(env, hard_fail):
    """vLLM's Platform.validate_environ over the engine's environment: None, or its message."""
    saved = dict(os.environ)
    before = len(COLLECT.messages)
    try:
        for name in [n for n in os.environ if n.startswith("VLLM_")]:
            del os.environ[name]
        os.environ.update({k: str(v) for k, v in env.items()})
        # vLLM 0.16.0 has no validate_environ: it does not check the names at all.
        validate = getattr(vllm.platforms.current_platform, "validate_environ", None)
        try:
            if validate is not None:
                validate(hard_fail)
        except Exception as exc:
            return _exception_text(exc)
        unknown = [m for m in COLLECT.messages[before:] if "Unknown vLLM environment variable" in m]
        return "; ".join(unknown) or None
    finally:
        del COLLECT.messages[before:]
        os.environ.clear()
        os.environ.update(saved)


def _kind(action):
    if isinstance(action, argparse.BooleanOptionalAction):
        return "bool"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)):
        return "flag"
    return "value"


def options():
    """The serve parser's options: every registered option string, grouped by action."""
    parser, _ = cli_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]
    by_action = {}
    for string, action in serve._option_string_actions.items():
        by_action.setdefault(id(action), (action, []))[1].append(string)
    out = []
    for action, strings in by_action.values():
        if isinstance(action, argparse._HelpAction):
            continue
        nargs = action.nargs
        out.append(
            {
                "strings": sorted(strings),
                "dest": action.dest,
                "kind": _kind(action),
                "nargs": nargs if nargs is None or isinstance(nargs, (int, str)) else str(nargs),
                # Declared order: argparse lists them so in its error.
                "choices": [str(c) for c in action.choices] if action.choices is not None else None,
            }
        )
    return {
        "options": out,
        "tool_parsers": sorted(ToolParserManager.list_registered()),
        "reasoning_parsers": sorted(ReasoningParserManager.list_registered()),
        "version": importlib.metadata.version("vllm"),
    }


def main():
    out = sys.stdout
    # Nothing vLLM prints may land between our answers.
    sys.stdout = sys.stderr
    out.write(json.dumps({"ready": True, "version": importlib.metadata.version("vllm")}) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            request = json.loads(line)
            if isinstance(request, dict) and request.get("options"):
                answer = options()
            else:
                if isinstance(request, list):
                    request = {"argv": request}
                answer = check([str(a) for a in request["argv"]], request.get("env"))
        except Exception as exc:  # a bad request must not end the process
            answer = {"ok": False, "stage": "checker", "exit_code": 1, "error": _exception_text(exc), "warnings": []}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
