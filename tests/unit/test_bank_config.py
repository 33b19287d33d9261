"""The federation's stream definitions and server configs (deploy/nats/bank/ must say what the code does)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from infrarsi.bank.federation import (
    HUB_STREAM,
    LEAF_DENY_EXPORTS,
    LEAF_DENY_IMPORTS,
    SHARED_STREAM,
    hub_stream_config,
    server_config_fragment,
    shared_stream_config,
)
from infrarsi.bus import credentials
from infrarsi.bus.client import BANK_STREAM
from infrarsi.bus.embedded import nats_server_binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "bank"


def test_hub_sources_each_cluster_through_its_domain() -> None:
    cfg = hub_stream_config(["cluster-b", "cluster-a"])
    assert cfg.name == HUB_STREAM and not cfg.subjects
    assert [(s.name, s.external.api) for s in cfg.sources] == [  # type: ignore[union-attr]
        (BANK_STREAM, "$JS.cluster-a.API"), (BANK_STREAM, "$JS.cluster-b.API")]


def test_shared_stream_filters_out_the_clusters_own_entries() -> None:
    one = shared_stream_config("hub", ["cluster-b"])
    assert one.name == SHARED_STREAM and not one.subjects
    [src] = one.sources  # type: ignore[misc]
    assert (src.name, src.external.api, src.filter_subject) == (HUB_STREAM, "$JS.hub.API", "bank.cluster-b.>")
    [multi] = shared_stream_config("hub", ["c", "b"]).sources  # type: ignore[misc]
    assert [t.src for t in multi.subject_transforms] == ["bank.b.>", "bank.c.>"]
    [everything] = shared_stream_config("hub", None).sources  # type: ignore[misc]
    assert everything.filter_subject is None and everything.subject_transforms is None
    with pytest.raises(ValueError):
        shared_stream_config("hub", ["bad.id"])


@pytest.mark.parametrize(("name", "domain"), [("hub.conf", "hub"), ("cluster-a.conf", "cluster-a"),
                                               ("cluster-b.conf", "cluster-b")])
def test_deploy_configs_are_valid_and_match_the_code(tmp_path: Path, name: str, domain: str) -> None:
    text = (DEPLOY / name).read_text()
    assert f"domain: {domain}" in text
    if domain == "hub":
        assert "leafnodes {\n  listen: 0.0.0.0:7422" in text
    else:
        deny, exports = (", ".join(f'"{subject}"' for subject in subjects)
                         for subjects in (LEAF_DENY_IMPORTS, LEAF_DENY_EXPORTS))
        assert f"deny_imports: [{deny}]" in text and f"deny_exports: [{exports}]" in text
        fragment = server_config_fragment("leaf", domain=domain, store_dir="/x", hub_leaf_urls=["nats-leaf://h:7422"])
        assert 'account: BANK, deny_imports: ["bank.>", "irsi.>", "$JS.*.API.STREAM.CREATE.>"' in fragment
        assert "account: BANK" in text
        # the accounts block is the one the code generates (only the unused user's password differs)
        generated = credentials.cluster_accounts_block(None)
        password = re.compile(r'"password": "[^"]*"')
        assert password.sub("", generated) in password.sub("", text)
    local = tmp_path / name
    local.write_text(text.replace("/data/nats", str(tmp_path)))
    check = subprocess.run([str(nats_server_binary()), "-c", str(local), "-t"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_secure_deploy_configs_are_valid_with_generated_credentials(tmp_path: Path) -> None:
    """deploy/nats/bank/secure: the hub with the users ``infrarsi creds --hub-user`` writes, the cluster with its
    principals' auth.conf and the leaf link's include; nats-server accepts both with the generated files."""
    from infrarsi.commands.creds import ACCOUNTS_CONF, BANK_USERS_CONF

    cluster, hub = tmp_path / "cluster", tmp_path / "hub"
    link_key, include = credentials.ensure_leaf_link(cluster)
    (tmp_path / "leaf-link.conf").write_bytes(include.read_bytes())
    (tmp_path / ACCOUNTS_CONF).write_text(credentials.cluster_accounts_block(credentials.ensure(cluster)))
    operator = credentials.ensure(hub)["cli.bank"]
    (tmp_path / BANK_USERS_CONF).write_text(credentials.bank_account_block({"operator": operator, "a": link_key}))
    for name in ("hub.conf", "cluster-a.conf"):
        text = (DEPLOY / "secure" / name).read_text()
        assert not re.search(r"\bSU[A-Z2-7]{50,}", text), f"a seed in {name}"
        local = tmp_path / name
        local.write_text(text.replace("/data/nats", str(tmp_path)))
        check = subprocess.run([str(nats_server_binary()), "-c", str(local), "-t"], capture_output=True, text=True)
        assert check.returncode == 0, (name, check.stderr)


def test_a_hub_user_must_be_a_user_public_key() -> None:
    from infrarsi.commands.creds import _hub_users
    from infrarsi.errors import UserError

    key = "U" + "A" * 55
    assert _hub_users([f"cluster-a={key}"]) == {"cluster-a": key}
    for bad in ("cluster-a", f"={key}", "cluster-a=SUAB", f"cluster-a={key[:-1]}"):
        with pytest.raises(UserError, match="NAME=KEY"):
            _hub_users([bad])
