"""extmatrix.facts: torch facts read from recorded PyPI data, offline (tests/fixtures/pypi)."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest
import yaml

from extmatrix import facts
from extmatrix.cli import main
from extmatrix.compat import BUILTIN, CompatFile

FIXTURES = Path(__file__).parent / "fixtures" / "pypi"
SNAPSHOT = FIXTURES / "compat-snapshot.yaml"
DAY = datetime.date(2026, 11, 22)
CU129 = "https://download.pytorch.org/whl/cu129/torch/"


def main_json() -> dict:
    return json.loads((FIXTURES / "torch.json").read_text())


def per_version() -> dict[str, dict]:
    return {p.name.removeprefix("torch-").removesuffix(".json"): json.loads(p.read_text())
            for p in FIXTURES.glob("torch-2.*.json")}


class Offline:
    """fetch() from the fixtures; download.pytorch.org fails the way it does here (at once),
    except for the pages named in `flavors` (url -> fixture file)."""

    def __init__(self, flavors: dict[str, str] | None = None) -> None:
        self.flavors = flavors or {}
        self.asked: list[tuple[str, str]] = []

    def __call__(self, url: str, accept: str) -> bytes:
        self.asked.append((url, accept))
        if url == "https://pypi.org/pypi/torch/json":
            return (FIXTURES / "torch.json").read_bytes()
        match = re.fullmatch(r"https://pypi\.org/pypi/torch/([^/]+)/json", url)
        if match and (FIXTURES / f"torch-{match.group(1)}.json").is_file():
            return (FIXTURES / f"torch-{match.group(1)}.json").read_bytes()
        if url in self.flavors:
            return (FIXTURES / self.flavors[url]).read_bytes()
        if url.startswith("https://download.pytorch.org/"):
            raise OSError("[Errno -2] Name or service not known")
        raise OSError(f"404: {url}")


@pytest.fixture(scope="module")
def releases() -> dict[str, facts.ReleaseFacts]:
    return facts.pypi_facts(main_json(), per_version())


# ------------------------------------------------------------------ PyPI facts


def test_default_cuda_is_read_from_the_pins(releases):
    # 2.6.0 pins nvidia-cuda-runtime-cu12==12.4.127 for x86_64 only: aarch64 is CPU-only.
    assert releases["2.6.0"].cuda == {"x86_64": "12.4", "aarch64": None}
    assert releases["2.6.0"].cuda_evidence == {"x86_64": "nvidia-cuda-runtime-cu12==12.4.127"}
    # 2.11.0 switched to the cuda-toolkit meta package, for every Linux platform.
    assert releases["2.11.0"].cuda == {"x86_64": "13.0", "aarch64": "13.0"}
    assert releases["2.11.0"].cuda_evidence["aarch64"] == "cuda-toolkit==13.0.2"
    assert releases["2.15.0"].pypi_cuda == "13.2"
    defaults = {v: r.pypi_cuda for v, r in releases.items()}
    assert defaults == {
        "2.5.0": "12.4", "2.5.1": "12.4", "2.6.0": "12.4", "2.7.0": "12.6", "2.7.1": "12.6",
        "2.8.0": "12.8", "2.9.0": "12.8", "2.9.1": "12.8", "2.10.0": "12.8", "2.11.0": "13.0",
        "2.12.0": "13.0", "2.12.1": "13.0", "2.13.0": "13.0", "2.14.0": "13.0",
        "2.14.1": "13.0", "2.15.0": "13.2"}


def test_aarch64_wheels_are_cpu_only_until_2_11(releases):
    flavors = {v: r.flavors()["aarch64"] for v, r in releases.items()}
    assert {v for v, f in flavors.items() if f == "cpu"} == {
        "2.5.0", "2.5.1", "2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0"}
    assert all(r.platforms == ("x86_64", "aarch64") for r in releases.values())


def test_pythons_per_platform_and_free_threaded(releases):
    r291 = releases["2.9.1"]
    assert r291.python_free_threaded == ["3.13t", "3.14t"]
    assert (r291.python_min, r291.python_max) == ("3.10", "3.14")
    assert r291.pythons["x86_64"] == ("3.10", "3.11", "3.12", "3.13", "3.13t", "3.14", "3.14t")
    assert releases["2.6.0"].python_free_threaded == []  # no cp313t wheel on PyPI
    assert releases["2.12.0"].python_free_threaded == ["3.13t", "3.14t"]
    assert releases["2.12.1"].python_free_threaded == ["3.14t"]  # 2.12.1 dropped cp313t
    assert releases["2.15.0"].python_free_threaded == ["3.14t", "3.15t"]
    # 2.5.x has cp313 for x86_64 only.
    assert releases["2.5.1"].pythons["aarch64"] == ("3.9", "3.10", "3.11", "3.12")
    assert releases["2.5.1"].python_max == "3.13"


def test_release_day_is_the_first_upload(releases):
    # 2.10.0's Linux x86_64 wheels were re-uploaded with build tag 3 weeks later.
    assert releases["2.10.0"].released == datetime.date(2026, 1, 21)
    assert releases["2.12.1"].released == datetime.date(2026, 6, 17)


def test_unknown_metadata_is_not_cpu():
    found = facts.pypi_facts(main_json(), {})
    assert found["2.11.0"].cuda is None
    assert found["2.11.0"].flavors() is None
    assert "pypi_cuda" not in facts.series_facts(found)["2.11"].fields()


def test_unread_metadata_says_which_facts_stay_unset():
    # 2.14.1's metadata files answered 404: what the file never had cannot be "as written".
    known = facts.series_facts(facts.pypi_facts(main_json(), {}))["2.11"]
    notes: list[str] = []
    facts._pypi_changes("2.11", {"pypi_cuda": "13.0"}, known, {}, notes)
    assert notes[-1] == ("torch 2.11: no metadata of 2.11.0 could be read, so pypi_cuda and "
                         "platforms are left as written (platforms unset: read them from one "
                         "of its wheels)")


def test_series_facts_have_compat_yaml_shape(releases):
    series = facts.series_facts(releases)
    assert list(series) == ["2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13",
                            "2.14", "2.15"]
    assert series["2.12"].fields() == {
        "latest": "2.12.1", "released": datetime.date(2026, 5, 13),
        "python": {"min": "3.10", "max": "3.14"}, "pypi_cuda": "13.0",
        "python_free_threaded": ["3.14t"], "platforms": {"x86_64": "cu130", "aarch64": "cu130"}}
    assert series["2.8"].fields()["platforms"] == {"x86_64": "cu128", "aarch64": "cpu"}


@pytest.mark.parametrize(("name", "expected"), [
    ("torch-2.10.0-3-cp313-cp313t-manylinux_2_28_x86_64.whl", ("2.10.0", "x86_64", "3.13t")),
    ("torch-2.5.1-cp39-cp39-manylinux2014_aarch64.whl", ("2.5.1", "aarch64", "3.9")),
    ("torch-2.11.0+cu129-cp314-cp314-manylinux_2_28_x86_64.whl",
     ("2.11.0+cu129", "x86_64", "3.14")),
    ("torch-2.6.0-cp312-none-macosx_11_0_arm64.whl", None),
    ("torch-2.6.0-cp312-cp312-win_amd64.whl", None),
    ("torch-2.6.0.tar.gz", None),
    ("not a wheel.whl", None),
])
def test_linux_wheel(name, expected):
    wheel = facts.linux_wheel(name)
    got = None if wheel is None else (str(wheel.version), wheel.platform, wheel.python)
    assert got == expected


# --------------------------------------------------------------- flavor indexes


@pytest.mark.parametrize("page", ["whl-cu129-torch.json", "whl-cu129-torch.html"])
def test_flavor_index_both_formats(page):
    fetch = Offline({CU129: page})
    index = facts.flavor_index("https://download.pytorch.org/whl", "cu129", fetch)
    assert fetch.asked == [(CU129, facts.SIMPLE)]
    assert index.url == CU129
    # 2.9.0's only file is yanked; Windows wheels do not count.
    assert list(index.versions) == ["2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0"]
    assert index.versions["2.8.0"] == {"aarch64": ("3.12",), "x86_64": ("3.10", "3.12", "3.13t")}
    assert index.versions["2.10.0"] == {"aarch64": ("3.12",), "x86_64": ("3.12",)}
    assert index.releases_of("2.12") == ["2.12.1"]


def test_both_formats_agree():
    read = [facts.flavor_index("https://download.pytorch.org/whl", "cu129", Offline({CU129: p}))
            for p in ("whl-cu129-torch.json", "whl-cu129-torch.html")]
    assert read[0] == read[1]


def test_flavor_index_keeps_its_own_flavor_only():
    page = {"meta": {"api-version": "1.0"}, "name": "torch", "files": [
        {"filename": "torch-2.14.1+cpu-cp312-cp312-manylinux_2_28_x86_64.whl", "hashes": {}},
        {"filename": "torch-2.14.1-cp312-cp312-manylinux_2_28_aarch64.whl", "hashes": {}},
        {"filename": "torch-2.14.1+cu130-cp312-cp312-manylinux_2_28_x86_64.whl", "hashes": {}},
    ]}
    index = facts.flavor_index("https://example.org/whl", "cpu",
                               lambda url, accept: json.dumps(page).encode())
    assert index.versions == {"2.14.1": {"aarch64": ("3.12",), "x86_64": ("3.12",)}}


def test_flavor_index_refuses_other_json():
    with pytest.raises(facts.FetchError, match="PEP 691"):
        facts.flavor_index("https://example.org/whl", "cpu", lambda url, accept: b'{"x": 1}')


# ---------------------------------------------------------------------- fetching


def test_core_metadata_stands_in_for_a_missing_per_version_json():
    """The mirror answers 404 for /pypi/torch/<v>/json; the wheel's .metadata is read."""
    metadata = (b"Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\nRequires-Python: >=3.10\n"
                b"Requires-Dist: cuda-toolkit[cudart]==13.0.2; platform_system == \"Linux\"\n")
    main = {"info": {"version": "2.15.0"}, "releases": {"2.11.0": [
        {"filename": "torch-2.11.0-cp312-cp312-win_amd64.whl", "url": "../../p/w.whl"},
        {"filename": "torch-2.11.0-cp313-cp313t-manylinux_2_28_x86_64.whl", "url": "../../p/t.whl"},
        {"filename": "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl", "url": "../../p/x.whl"},
    ]}}
    asked = []

    def fetch(url: str, accept: str) -> bytes:
        asked.append(url)
        if url == "https://pypi.org/pypi/torch/json":
            return json.dumps(main).encode()
        if url == "https://pypi.org/p/x.whl.metadata":
            return metadata
        raise OSError("404")

    got = facts.fetch_pypi(fetch, ["2.11"])
    assert asked == ["https://pypi.org/pypi/torch/json", "https://pypi.org/pypi/torch/2.11.0/json",
                     "https://pypi.org/p/x.whl.metadata"]  # GIL x86_64 first, Windows never
    assert got.per_version["2.11.0"]["info"]["requires_dist"] == [
        'cuda-toolkit[cudart]==13.0.2; platform_system == "Linux"']
    assert got.notes == []


# ----------------------------------------------------------------------- refresh


def test_refresh_golden(golden):
    before = SNAPSHOT.read_text()
    new_text, diff, notes = facts.refresh(SNAPSHOT, Offline(), today=DAY)
    assert SNAPSHOT.read_text() == before  # refresh writes nothing
    golden("facts-refresh.diff.txt", diff)
    assert "not reachable: https://download.pytorch.org/whl/cu129/torch/" in "\n".join(notes)
    assert sum(n.startswith("not reachable: https://download.pytorch.org/") for n in notes) == 17
    # PyPI has no cp313t wheel of 2.6.0, but that does not take 3.13t away.
    assert any(n.startswith("torch 2.6: python_free_threaded 3.13t has no PyPI wheel")
               for n in notes)
    assert "torch 2.5: 2.5.1 has no aarch64 wheel for 3.13 (the python range is the union of " \
           "platforms)" in notes
    data = yaml.safe_load(new_text)
    assert data["torch"]["2.8"]["platforms"] == {"x86_64": "cu128", "aarch64": "cpu"}
    assert data["torch"]["2.12"]["only_in"] == {"12.9": ["2.12.1"]}  # unreachable: as written
    assert data["cuda"] == yaml.safe_load(before)["cuda"]


def test_refresh_of_a_refreshed_file_changes_nothing(tmp_path):
    new_text, diff, _ = facts.refresh(SNAPSHOT, Offline(), today=DAY)
    assert diff
    refreshed = tmp_path / "compat.yaml"
    refreshed.write_text(new_text)
    again, diff, _ = facts.refresh(refreshed, Offline(), today=datetime.date(2027, 1, 1))
    assert (again, diff) == (new_text, "")


def test_refresh_with_a_reachable_flavor_index():
    """cu129 readable, the rest not: only 12.9 entries move (2.9.0's cu129 wheel is yanked
    in the fixture, so 12.9 becomes 2.9.1-only); the others stay as written."""
    _, diff, notes = facts.refresh(SNAPSHOT, Offline({CU129: "whl-cu129-torch.json"}), today=DAY)
    assert not any("cu129" in n for n in notes)
    assert '+    only_in: {"12.9": ["2.9.1"]}\n' in diff
    assert "only_in 12.9: 2.9.1 (of 2.9.0, 2.9.1)" in diff.replace("\n+      ", " ")
    assert '-    only_in: {"12.9": ["2.12.1"]}' not in diff
    # An index that has the series adds its toolkit; one that does not removes it.
    index = facts.FlavorIndex("cu129", CU129, {"2.14.0": {"x86_64": ("3.12",)}})
    indexes = facts._Indexes({"12.9": index}, {})
    entry = {"cuda": ["12.6", "13.0"], "only_in": {}}
    changed: dict = {}
    evidence = facts._index_changes("2.14", entry, indexes, ["2.14.0", "2.14.1"], changed)
    assert changed == {"cuda": ["12.6", "12.9", "13.0"], "only_in": {"12.9": ["2.14.0"]}}
    assert evidence[0] == "cuda +12.9 (cu129 has 2.14.0)"
    changed = {}
    facts._index_changes("2.13", {"cuda": ["12.9", "13.0"]}, indexes, ["2.13.0"], changed)
    assert changed == {"cuda": ["13.0"]}


def test_refresh_of_the_real_facts_file(tmp_path):
    """Whatever the facts file says today: the rewrite still validates (once compat.py
    knows `platforms`) and is a fixed point."""
    new_text, _diff, _notes = facts.refresh(BUILTIN, Offline(), today=DAY)
    data = yaml.safe_load(new_text)
    for entry in data["torch"].values():
        entry.pop("platforms")  # the new key: TorchFacts does not have it yet
    CompatFile.model_validate(data)
    (tmp_path / "compat.yaml").write_text(new_text)
    assert facts.refresh(tmp_path / "compat.yaml", Offline(), today=DAY)[1] == ""


def test_refresh_keeps_rocm_archs_and_drops_those_of_a_flavor_gone():
    """rocm_archs is a person's key: a refresh leaves it as written, except the list of a
    ROCm flavor the index shows the release does not ship (it would no longer validate)."""
    from extmatrix import source as yaml_source
    from extmatrix.config import validate

    rocm72 = "https://download.pytorch.org/whl/rocm7.2/torch/"
    page = json.dumps({"meta": {"api-version": "1.0"}, "name": "torch", "files": [
        {"filename": f"torch-{v}+rocm7.2-cp312-cp312-manylinux_2_28_x86_64.whl"}
        for v in ("2.13.0", "2.14.1")]}).encode()
    offline = Offline()
    new_text, diff, _ = facts.refresh(
        BUILTIN, lambda url, accept: page if url == rocm72 else offline(url, accept), today=DAY)
    before, after = yaml.safe_load(BUILTIN.read_text())["torch"], yaml.safe_load(new_text)["torch"]
    assert after["2.12"]["rocm"] == ["7.1"]
    assert after["2.12"]["rocm_archs"] == {"7.1": before["2.12"]["rocm_archs"]["7.1"]}
    assert "rocm_archs -7.2 (flavor gone)" in diff.replace("\n+      ", " ")
    for name in ("2.5", "2.6", "2.10", "2.14", "2.15"):
        assert after[name].get("rocm_archs") == before[name].get("rocm_archs")
    validate(yaml_source.parse(new_text, "compat.yaml"), CompatFile)


def test_index_changes_drop_only_the_arch_list_of_the_flavor_gone():
    index = facts.FlavorIndex("rocm7.1", "https://example.org/whl/rocm7.1/torch/",
                              {"2.12.1": {"x86_64": ("3.12",)}})
    entry = {"rocm": ["7.1", "7.2"], "rocm_archs": {"7.1": ["gfx90a"], "7.2": ["gfx942"]}}
    changed: dict = {}
    evidence = facts._index_changes("2.13", entry, facts._Indexes({}, {"7.1": index}),
                                    ["2.13.0"], changed)
    assert changed == {"rocm": ["7.2"], "rocm_archs": {"7.2": ["gfx942"]}}
    assert evidence == ["rocm -7.1 (rocm7.1 has no 2.13.x)", "rocm_archs -7.1 (flavor gone)"]
    changed = {}
    assert facts._index_changes("2.12", entry, facts._Indexes({}, {"7.1": index}),
                                ["2.12.0", "2.12.1"], changed) == [
        "only_in 7.1: 2.12.1 (of 2.12.0, 2.12.1)"]
    assert "rocm_archs" not in changed


@pytest.mark.parametrize(("edit", "said"), [
    # plan reads 2.10 as written; plain YAML, which the refresh rewrites, reads 2.1.
    (lambda text: text.replace('\n  "2.10":', "\n  2.10:"),
     'torch series written as numbers (2.1 here); quote every series key, as in "2.10":'),
    (lambda text: "torch: [\n", "YAML syntax error"),
])
def test_refresh_refuses_a_facts_file_it_would_misread_in_one_line(tmp_path, capsys, edit, said):
    from extmatrix.cli import main

    path = tmp_path / "compat.yaml"
    path.write_text(edit(BUILTIN.read_text()))
    assert main(["facts", "refresh", "--compat", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "Traceback" not in err


def test_a_missing_compat_file_names_the_option_that_chose_it(tmp_path, capsys):
    assert main(["facts", "refresh", "--compat", str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err == (f"{tmp_path / 'nope.yaml'}: file not found; pass an "
                                       "existing compatibility facts file with --compat\n")
