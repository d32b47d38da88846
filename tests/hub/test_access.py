"""The start-of-run write check, from whoami answers shaped like the Hub's."""

import pytest

from speedtronic.hub.access import write_access_problem


def whoami(role, name="alice", orgs=(), fine=None):
    roles = {o["name"]: o["roleInOrg"] for o in orgs}
    return {
        "name": name,
        "orgs": list(roles),
        "org_roles": roles,
        "token_role": role,
        "fine_grained": fine or {},
    }


def scoped(name, *permissions):
    return {"scoped": [{"entity": {"type": "model", "name": name}, "permissions": permissions}]}


@pytest.mark.parametrize(
    ("answer", "repo", "problem"),
    [
        (whoami("write"), "alice/run", None),
        (whoami("read"), "alice/run", "read-only"),
        (whoami("write"), "org/run", "not a member of org"),
        (whoami("write", orgs=[{"name": "org", "roleInOrg": "read"}]), "org/run", "'read' role"),
        (whoami("write", orgs=[{"name": "org", "roleInOrg": "write"}]), "org/run", None),
        (whoami("write", orgs=[{"name": "org", "roleInOrg": "contributor"}]), "org/run", None),
        (whoami("fineGrained", fine=scoped("org/run", "repo.write")), "org/run", None),
        (whoami("fineGrained", fine=scoped("org", "repo.write")), "org/run", None),
        (whoami("fineGrained", fine=scoped("org/run", "repo.content.read")), "org/run", "no repo"),
        (whoami("fineGrained", fine=scoped("org/other", "repo.write")), "org/run", "no repo"),
        ({"name": "alice"}, "org/run", None),  # an answer that does not decide: say nothing
    ],
)
def test_write_access_problem(answer, repo, problem):
    found = write_access_problem(answer, repo)
    assert (found is None) if problem is None else (problem in found)
