"""The invoice API (contract 7) over real HTTP: `gpumeter api` on uvicorn on a free port, real
ClickHouse behind it. Tokens, tenant isolation (404), 401s, 400s, JSON/CSV/PDF, month-to-date
usage, /metrics, /openapi.json, and a schemathesis run over the served schema finding no 5xx.

Expected figures are hand arithmetic (comments) or tests/unit/reference_billing.py."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pypdf import PdfReader
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from gpumeter.app import schema
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse
from testkit.builders import CARDS, L4, big_h100_user, sample
from tests.integration.billing_data import configure, ledger_rows, store_rated
from tests.services import Endpoints, free_port, isolated_settings, run_cli, running_api
from tests.unit import reference_billing as ref

pytestmark = pytest.mark.integration

TOKENS = {"team-a": "tok-team-a-3f9c", "team-b": "tok-team-b-77d1", "finance": "tok-finance-c0ffee"}
NOW = datetime.now(UTC)
CURRENT = f"{NOW.year:04d}-{NOW.month:02d}"
TENANTS = [{"tenant": "team-a", "commitment": "1000.00", "credits": "250.00"}]


@dataclass
class Api:
    url: str
    settings: Settings
    on_time: list[dict[str, Any]]
    late: list[dict[str, Any]]
    team_b: list[dict[str, Any]]

    def get(self, path: str, token: str | None = None, **params: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.get(self.url + path, headers=headers, params=params, timeout=60)


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


@pytest.fixture(scope="module")
def api(endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("api")
    configured = isolated_settings(endpoints, tmp / "data")
    client = clickhouse.connect(configured.clickhouse.dsn)
    schema.migrate(client)
    client.close()
    configure(configured, tmp, TENANTS)
    h100 = big_h100_user(seed=51, windows=110)
    on_time, late = h100[:100], h100[100:]
    team_b = [
        sample(f"b-{i}", tenant="team-b", gpu_model=L4, quantity="4", start=f"2026-11-1{i}T00:00:00Z")
        for i in range(3)
    ]
    current = [
        sample("now-1", kind="cpu", quantity="16", start=f"{CURRENT}-01T00:00:00Z", seconds=1800),
        sample("now-2", kind="memory", quantity="64", start=f"{CURRENT}-01T01:00:00Z"),
    ]
    store_rated(configured, [*on_time, *team_b, *current])
    closed = run_cli(configured, "invoice", "close", "--period", "2026-11", "--out", str(tmp / "out"))
    assert closed.returncode == 0, closed.stderr
    store_rated(configured, late)
    closed = run_cli(configured, "invoice", "close", "--period", "2026-11", "--out", str(tmp / "out2"))
    assert closed.returncode == 0, closed.stderr
    tokens = tmp / "tokens.yaml"
    entries = [
        {
            "sha256": hashlib.sha256(TOKENS[name].encode()).hexdigest(),
            **({"role": "finance"} if name == "finance" else {"tenant": name}),
        }
        for name in TOKENS
    ]
    tokens.write_text(json.dumps({"tokens": entries}))  # JSON is YAML too
    configured.api.tokens = tokens
    # The property-based run below makes hundreds of requests a second: not what it tests.
    configured.api.rate_limit, configured.api.rate_burst = 100_000, 100_000
    configured.api.listen = f"127.0.0.1:{free_port()}"
    try:
        with running_api(configured, tmp / "api.log") as url:
            yield Api(url, configured, on_time, late, team_b)
    finally:
        clickhouse.drop_database(configured.clickhouse.dsn)


ENDPOINTS = [
    "/metrics",
    "/openapi.json",
    "/v1/invoices?period=2026-11",
    "/v1/tenants/team-a/invoices/2026-11",
    "/v1/tenants/team-a/invoices/2026-11?format=csv",
    "/v1/tenants/team-a/invoices/2026-11?format=pdf",
    "/v1/tenants/team-a/usage?period=2026-11",
]


def test_healthz_needs_no_token(api: Api) -> None:
    response = api.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer", "Bearer not-a-token", f"Basic {TOKENS['finance']}", TOKENS["finance"]],
    ids=["no-header", "bearer-without-token", "unknown-token", "basic-scheme", "token-without-scheme"],
)
def test_missing_or_unknown_token_is_401(api: Api, path: str, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = httpx.get(api.url + path, headers=headers, timeout=30)
    assert response.status_code == 401
    assert response.json()["error"] in (
        "missing bearer token (Authorization: Bearer <token>)",
        "unknown bearer token",
    )
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/tenants/team-b/invoices/2026-11",
        "/v1/tenants/team-b/invoices/2026-11?format=csv",
        "/v1/tenants/team-b/invoices/2026-11?format=pdf",
        "/v1/tenants/team-b/invoices/2026-13",  # malformed, but another tenant's: no hint, 404
        "/v1/tenants/team-b/usage",
        "/v1/tenants/team-b/usage?period=2026-11",
        "/v1/tenants/team-b/usage?period=garbage",
    ],
)
def test_a_tenant_token_on_another_tenants_data_is_404_like_a_missing_tenant(api: Api, path: str) -> None:
    theirs = api.get(path, TOKENS["team-a"])
    missing = api.get(path.replace("team-b", "nobody"), TOKENS["team-a"])
    assert theirs.status_code == missing.status_code == 404
    assert theirs.content == missing.content == b'{"error":"not found"}'
    # finance sees team-b's (except the malformed request)
    if "2026-13" not in path and "garbage" not in path:
        assert api.get(path, TOKENS["finance"]).status_code == 200


@pytest.mark.parametrize(
    ("path", "params", "reason"),
    [
        pytest.param(
            "/v1/invoices", {"period": "2026-13"}, "period must be YYYY-MM (e.g. 2026-11)", id="month-13"
        ),
        pytest.param(
            "/v1/invoices",
            {"period": "2026-1"},
            "period must be YYYY-MM (e.g. 2026-11)",
            id="one-digit-month",
        ),
        pytest.param("/v1/invoices", {}, "period must be YYYY-MM (e.g. 2026-11)", id="no-period"),
        pytest.param(
            "/v1/tenants/team-a/invoices/2026-00",
            {},
            "period must be YYYY-MM (e.g. 2026-11)",
            id="month-zero-in-the-path",
        ),
        pytest.param(
            "/v1/tenants/team-a/invoices/2026-11",
            {"format": "xml"},
            "format must be json, csv or pdf",
            id="unknown-format",
        ),
        pytest.param(
            "/v1/tenants/team-a/invoices/2026-11",
            {"format": "pdf", "paper": "A3"},
            "paper must be A4 or Letter",
            id="unknown-paper",
        ),
        pytest.param(
            "/v1/tenants/team-a/usage",
            {"period": "nov"},
            "period must be YYYY-MM (e.g. 2026-11)",
            id="usage-period-a-month-name",
        ),
    ],
)
def test_malformed_period_format_or_paper_is_400_with_one_reason(
    api: Api, path: str, params: dict[str, str], reason: str
) -> None:
    for who in ("team-a", "finance"):
        response = api.get(path, TOKENS[who], **params)
        assert response.status_code == 400
        assert response.json() == {"error": reason}


NON_ASCII_PERIODS = [
    pytest.param("\u0662\u0660\u0662\u0666-11", id="arabic-indic-year"),
    pytest.param("2026-\u0661\u0661", id="arabic-indic-month"),
    pytest.param("\uff12\uff10\uff12\uff16-11", id="fullwidth-year"),
]


@pytest.mark.parametrize("period", NON_ASCII_PERIODS)
def test_a_period_in_non_ascii_digits_is_400_never_a_phantom_invoice(api: Api, period: str) -> None:
    """Issue 31, point 7: `\\d` matched any Unicode digit, so a period in Arabic-Indic digits
    was a valid month: a draft invoice with a true-up as JSON, and a 500 as CSV or PDF."""
    requests = [("/v1/invoices", {"period": period}), ("/v1/tenants/team-a/usage", {"period": period})]
    invoice = f"/v1/tenants/team-a/invoices/{period}"
    requests += [(invoice, {"format": form}) for form in ("json", "csv", "pdf")]
    for path, params in requests:
        response = api.get(path, TOKENS["team-a"], **params)
        assert response.status_code == 400, (path, params, response.text)
        assert response.json() == {"error": "period must be YYYY-MM (e.g. 2026-11)"}


def test_a_tenant_lists_only_its_own_invoices_and_finance_lists_all(api: Api) -> None:
    rows = ledger_rows(api.settings)
    mine = api.get("/v1/invoices", TOKENS["team-a"], period="2026-11").json()
    assert [d["number"] for d in mine] == [r["number"] for r in rows if r["tenant"] == "team-a"]
    assert [d["status"] for d in mine] == ["final", "adjustment"]
    everything = api.get("/v1/invoices", TOKENS["finance"], period="2026-11").json()
    assert sorted(d["number"] for d in everything) == sorted(r["number"] for r in rows)
    assert {d["tenant"] for d in everything} == {"team-a", "team-b"}
    # A month with nothing issued: the draft of team-a (its commitment binds every month).
    drafts = api.get("/v1/invoices", TOKENS["team-a"], period=CURRENT).json()
    assert [(d["status"], d.get("number")) for d in drafts] == [("draft", None)]


def test_a_finalized_month_is_the_final_with_its_adjustments_in_json_csv_and_pdf(api: Api) -> None:
    document = api.get("/v1/tenants/team-a/invoices/2026-11", TOKENS["team-a"]).json()
    reference = ref.reference_invoices(api.on_time, CARDS, TENANTS)[("team-a", "2026-11")]
    for key in ("lines", "subtotal", "commitment_true_up", "credits", "total"):
        assert document[key] == reference[key], key
    # 800 GPU-hours x 2.50 = 2000.00, credits 250.00 -> 1750.00
    assert document["total"] == "1750.00" and document["status"] == "final"
    (adjustment,) = document["adjustments"]
    # 80 late GPU-hours: 880 h x 2.50 = 2200.00 in full, 200.00 more
    assert (adjustment["status"], adjustment["adjusts"], adjustment["total"]) == (
        "adjustment",
        document["number"],
        "200.00",
    )
    for doc in (document, adjustment):
        body = {k: v for k, v in doc.items() if k not in ("content_sha256", "adjustments")}
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert hashlib.sha256(canonical.encode()).hexdigest() == doc["content_sha256"]

    csv_response = api.get("/v1/tenants/team-a/invoices/2026-11", TOKENS["team-a"], format="csv")
    assert csv_response.headers["content-type"].startswith("text/csv")
    records = list(csv.DictReader(io.StringIO(csv_response.text)))
    totals = [r["amount"] for r in records if r["kind"] == "total"]
    numbers = [r["amount"] for r in records if r["kind"] == "number"]
    assert totals == ["1750.00", "200.00"] and numbers == [document["number"], adjustment["number"]]

    pdf_response = api.get(
        "/v1/tenants/team-a/invoices/2026-11", TOKENS["finance"], format="pdf", paper="Letter"
    )
    assert pdf_response.headers["content-type"] == "application/pdf"
    reader = PdfReader(io.BytesIO(pdf_response.content))
    text = "\n".join(page.extract_text() for page in reader.pages)
    assert len(reader.pages) == 2 and float(reader.pages[0].mediabox.width) == 612.0
    for figure in (
        document["number"],
        adjustment["number"],
        "1750.00 USD",
        "200.00 USD",
        document["content_sha256"],
        adjustment["content_sha256"],
    ):
        assert figure in text, figure


def test_an_open_month_is_the_draft(api: Api) -> None:
    document = api.get(f"/v1/tenants/team-a/invoices/{CURRENT}", TOKENS["team-a"]).json()
    # 16 cores x 0.5 h x 0.04 = 0.32; 64 GiB x 1 h x 0.005 = 0.32; commitment 1000.00 -> true-up 999.36
    assert [line["amount"] for line in document["lines"]] == ["0.32", "0.32"]
    assert (document["status"], document["commitment_true_up"], document["total"]) == (
        "draft",
        "999.36",
        "750.00",
    )
    assert "number" not in document and "adjustments" not in document
    assert api.get(f"/v1/tenants/team-b/invoices/{CURRENT}", TOKENS["team-b"]).status_code == 404  # no usage


def test_month_to_date_usage_lines_and_list_cost(api: Api) -> None:
    usage = api.get("/v1/tenants/team-a/usage", TOKENS["team-a"]).json()  # default: this month
    assert usage["period"] == CURRENT and usage["currency"] == "USD"
    assert [
        (line["kind"], line["quantity"], line["list_cost"], line["samples"]) for line in usage["lines"]
    ] == [
        ("cpu", "8.000000", "0.32", 1),  # 16 cores x 0.5 h
        ("memory", "64.000000", "0.32", 1),
    ]
    assert usage["list_cost"] == "0.64"
    november = api.get("/v1/tenants/team-b/usage", TOKENS["team-b"], period="2026-11").json()
    # 3 x 4 L4-hours at the fallback 1.80: 21.60 list cost
    assert [(line["gpu_model"], line["quantity"]) for line in november["lines"]] == [(L4, "12.000000")]
    assert november["list_cost"] == "21.60"


def test_metrics_and_openapi(api: Api) -> None:
    api.get("/v1/invoices", TOKENS["team-b"], period="2026-11")
    metrics = api.get("/metrics", TOKENS["team-b"])
    assert metrics.status_code == 200
    assert 'gpumeter_api_requests_total{route="/v1/invoices",status="200"}' in metrics.text
    assert 'status="401"' in metrics.text
    spec = api.get("/openapi.json", TOKENS["team-a"]).json()
    assert set(spec["paths"]) >= {
        "/healthz",
        "/metrics",
        "/openapi.json",
        "/v1/invoices",
        "/v1/tenants/{tenant}/invoices/{period}",
        "/v1/tenants/{tenant}/usage",
    }
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_property_based_run_over_the_schema_finds_no_server_error(api: Api) -> None:
    """Every operation of the served schema, with generated (and the schema's example) inputs,
    under a finance and a tenant token. (schemathesis' own pytest plugin does not load under
    pytest 9, so its strategies drive hypothesis directly.)"""
    spec = schemathesis.openapi.from_url(api.url + "/openapi.json", headers=auth("finance"))
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    operations = [result.ok() for result in spec.get_all_operations()]  # type: ignore[union-attr]
    assert {op.label for op in operations} >= {
        "GET /healthz",
        "GET /metrics",
        "GET /v1/invoices",
        "GET /v1/tenants/{tenant}/invoices/{period}",
        "GET /v1/tenants/{tenant}/usage",
    }
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def call(case: Any) -> None:
            for who in ("finance", "team-a"):
                case.call_and_validate(base_url=api.url, headers=auth(who), checks=checks)

        call()


# Arbitrary input everywhere a caller controls it (issue 31: never a 500, bad input a 400 with a
# JSON reason): path segments and query values of any text (digits of other scripts, huge numbers,
# JSON), unknown parameters, and any JSON as a body, on every endpoint and method, with a valid
# token. The schemathesis run above draws from the schema; this draws from outside it.
ANY_TEXT = (
    st.text(max_size=40)
    | st.sampled_from(["2026-11", "\u0662\u0660\u0662\u0666-11", "9" * 5_000, "-1", "null", "{}", "%00",
                       "team-a", "team-b", "../team-b", "2026-11/../../x", "json", "csv", "pdf", "A4"])
    | st.integers().map(str)
)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: (st.lists(children, max_size=4)
                      | st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=10,
)
TEMPLATES = [
    "/v1/invoices",
    "/v1/tenants/{tenant}/invoices/{period}",
    "/v1/tenants/{tenant}/usage",
    "/metrics",
    "/openapi.json",
    "/healthz",
]


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    template=st.sampled_from(TEMPLATES),
    tenant=ANY_TEXT,
    period=ANY_TEXT,
    params=st.dictionaries(st.sampled_from(["period", "format", "paper", "tenant", "x"]), ANY_TEXT,
                           max_size=4),
    method=st.sampled_from(["GET", "GET", "POST", "PUT", "DELETE"]),
    body=st.none() | ANY_JSON,
    who=st.sampled_from(["finance", "team-a"]),
)
def test_any_input_on_any_endpoint_is_never_a_server_error(
    api: Api, template: str, tenant: str, period: str, params: dict[str, str], method: str, body: Any,
    who: str,
) -> None:
    path = template.format(tenant=quote(tenant, safe=""), period=quote(period, safe=""))
    content = None if body is None else json.dumps(body).encode()
    response = httpx.request(method, api.url + path, params=params, content=content, headers=auth(who),
                             timeout=60)
    assert response.status_code < 500, (method, path, params, response.text[:300])
    if response.status_code in (400, 401, 404, 405, 422):
        reason = response.json()["error"]
        assert isinstance(reason, str) and reason, response.text


def test_api_with_a_bad_tokens_file_exits_2_naming_it(settings: Settings, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens:\n  - {sha256: 1234, tenant: team-a}\n")
    settings.api.tokens = tokens
    result = run_cli(settings, "api", "--listen", f"127.0.0.1:{free_port()}")
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpumeter: error: {tokens}: tokens.0.sha256")
    assert result.stderr.count("\n") == 1
