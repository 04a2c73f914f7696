"""One or two examples at the end of every command's `--help`, kept in one table.

Examples live here rather than in each command's docstring so that one test can check them all: every
command has some, and every example names a command and options that exist (tests/cli/test_cli_ux.py).
`main.py` hangs them on the commands as typer's `epilog` when it loads a sub-command.
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape

EXAMPLES: dict[str, tuple[str, ...]] = {
    "": ("tessera train tiny-cpu.yaml", "tessera run list"),
    "storage": ("tessera storage ls s3://bucket/datasets/",),
    "storage ls": ("tessera storage ls s3://bucket/datasets/ --json",),
    "storage cp": ("tessera storage cp ./data.jsonl s3://bucket/raw/data.jsonl",
                   "tessera storage cp -r s3://bucket/runs/gpt/ ./gpt/"),
    "storage rm": ("tessera storage rm -r s3://bucket/tmp/",),
    "data": ("tessera data convert corpus.jsonl s3://bucket/mds/corpus", "tessera data verify s3://bucket/mds/corpus"),
    "data convert": ("tessera data convert corpus.jsonl ./mds --compression zstd",
                     "tessera data convert ./parquet/ s3://bucket/mds --workers 8"),
    "data inspect": ("tessera data inspect s3://bucket/mds/corpus",),
    "data head": ("tessera data head ./mds -n 3",),
    "data verify": ("tessera data verify ./mds", "tessera data verify s3://bucket/mds --quick"),
    "data repair": ("tessera data repair ./mds --dry-run",),
    "data merge-index": ("tessera data merge-index ./mds ./mds/part-0 ./mds/part-1",),
    "run": ("tessera run submit -f run.yaml --follow", "tessera run list"),
    "run submit": ("tessera run submit -f run.yaml", "tessera run submit -f run.yaml --cluster hpc --follow"),
    "run list": ("tessera run list --status RUNNING", "tessera run list --wide --format plain | grep FAILED"),
    "run describe": ("tessera run describe gpt-tiny", "tessera run describe gpt-tiny --json"),
    "run metrics": ("tessera run metrics gpt-tiny --plot", "tessera run metrics gpt-tiny --json | jq .lr"),
    "run logs": ("tessera run logs gpt-tiny -f", "tessera run logs gpt-tiny --resumption 0 --rank 1"),
    "run stop": ("tessera run stop gpt-tiny --wait",),
    "run restart": ("tessera run restart gpt-tiny --cluster hpc",),
    "run move": ("tessera run move gpt-tiny --cluster hpc --follow",),
    "run delete": ("tessera run delete gpt-tiny --yes",),
    "run update": ("tessera run update gpt-tiny --priority high --max-duration 12h",),
    "run clone": ("tessera run clone gpt-tiny --name gpt-tiny-2 --gpus 8",),
    "run convert": ("tessera run convert mcli.yaml > run.yaml",),
    "cluster": ("tessera cluster add hpc --type slurm --partition gpu", "tessera cluster list"),
    "cluster add": ("tessera cluster add hpc --type slurm --partition gpu --account ml",
                    "tessera cluster add k8s --type kubernetes --namespace ml --image ghcr.io/me/train:1"),
    "cluster list": ("tessera cluster list", "tessera cluster list --json"),
    "cluster describe": ("tessera cluster describe hpc",),
    "cluster remove": ("tessera cluster remove hpc",),
    "cluster clear-node": ("tessera cluster clear-node hpc node-3",),
    "secret": ("tessera secret create s3 r2 --access-key-id KEY --from-file r2-secret.txt", "tessera secret list"),
    "secret list": ("tessera secret list", "tessera secret list --json"),
    "secret remove": ("tessera secret remove r2",),
    "secret create": ("tessera secret create env hf --from-env HF_TOKEN",),
    "secret create s3": ("tessera secret create s3 r2 --access-key-id KEY --from-file r2-secret.txt "
                         "--endpoint https://ACCOUNT.r2.cloudflarestorage.com",
                         "tessera secret create s3 aws --credentials-file ~/.aws/credentials"),
    "secret create env": ("tessera secret create env hf --from-env HF_TOKEN",
                          "tessera secret create env api --from-file api.env"),
    "secret create file": ("tessera secret create file kube ~/.kube/config --env-var KUBECONFIG",),
    "secret create mounted": ("tessera secret create mounted token token.txt",),
    "secret create ssh": ("tessera secret create ssh deploy ~/.ssh/id_ed25519",),
    "secret create git-ssh": ("tessera secret create git-ssh github ~/.ssh/id_ed25519",),
    "secret create gcp": ("tessera secret create gcp gcs --credentials-file sa.json",),
    "secret create docker-registry": ("tessera secret create docker-registry ghcr --username me --server ghcr.io "
                                      "--password-file token.txt",),
    "secret create docker": ("tessera secret create docker hub --username me --password-stdin < token.txt",),
    "secret create azure": ("tessera secret create azure blob --account-name acct --from-env AZURE_KEY",),
    "server": ("tessera server start --host 0.0.0.0 --port 8080",
               "tessera server admin create-user alice --team ml"),
    "server start": ("tessera server start --host 0.0.0.0 --port 8080",
                     "tessera server start --db postgresql+psycopg://tessera@db/tessera --artifacts s3://bucket/tessera"),
    "server migrate": ("tessera server migrate --db postgresql+psycopg://tessera@db/tessera",),
    "server admin": ("tessera server admin create-user alice --team ml", "tessera server admin list-users"),
    "server admin create-team": ("tessera server admin create-team ml",),
    "server admin create-user": ("KEY=$(tessera server admin create-user alice --team ml)",
                                 "tessera server admin create-user root --team ops --admin"),
    "server admin new-key": ("tessera server admin new-key alice",),
    "server admin revoke-key": ("tessera server admin revoke-key tsk_o5gtY06m",),
    "server admin list-users": ("tessera server admin list-users", "tessera server admin list-users --json"),
    "launch": ("tessera launch train.py -n 8", "srun tessera launch train.py -n 8 --nnodes 2"),
    "llm": ("tessera llm prep ./texts ./mds --tokenizer gpt2 --seq-len 2048",
            "tessera llm generate ./runs/tiny-cpu/checkpoints --prompt 'Once upon a time'"),
    "llm prep": ("tessera llm prep ./texts ./mds --tokenizer gpt2 --seq-len 2048",
                 "tessera llm prep chats.jsonl ./sft --tokenizer ./tok.json --format chat"),
    "llm generate": ("tessera llm generate ./runs/tiny-cpu/checkpoints --prompt 'Once upon a time'",
                     "tessera llm generate ./export --prompt 'Hello' --greedy --max-new-tokens 20"),
    "llm eval": ("tessera llm eval ./runs/tiny-cpu/checkpoints --data ./mds --split val",
                 "tessera llm eval ./export --icl-tasks tasks.yaml"),
    "llm export": ("tessera llm export ./runs/tiny-cpu/checkpoints ./export",
                   "tessera llm export ./runs/lora/checkpoints ./hf --format hf"),
    "llm info": ("tessera llm info mpt-125m mpt-1b",),
    "llm tokenizer": ("tessera llm tokenizer train ./texts --vocab-size 8192 --out tok.json",),
    "llm tokenizer train": ("tessera llm tokenizer train ./texts --vocab-size 8192 --out tok.json",),
    "train": ("tessera train tiny-cpu.yaml max_duration=20ba",
              "tessera train mpt-125m.yaml --plan --gpu H100 --nodes 2"),
    "recipe": ("tessera recipe convert foundry.yaml -o recipe.yaml",),
    "recipe convert": ("tessera recipe convert foundry.yaml -o recipe.yaml",),
    "login": ("tessera login https://tessera.example.com",),
    "logout": ("tessera logout",),
}


def epilog(path: str) -> str | None:
    """The examples of the command at `path` (`run list`; "" for `tessera` itself) as an epilog, written
    for typer's rich help: one line each, brackets escaped."""
    examples = EXAMPLES.get(path)
    if not examples:
        return None
    return "Examples:\n" + "\n".join(f"$ {escape(example)}" for example in examples)


def add_examples(command: Any, path: str) -> None:
    """Set the epilog of `command` (loaded at `path`) and of every sub-command under it."""
    command.epilog = command.epilog or epilog(path)
    for name, sub in (getattr(command, "commands", None) or {}).items():
        add_examples(sub, f"{path} {name}".strip())
