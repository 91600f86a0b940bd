"""The approvals console, black-box, in a real browser, signing in at a real identity provider.

Real parts, started here and stopped by PID: the toolgate binary (a catalog whose callers carry
JWTs, its MCP door and its console on loopback ports), an OpenID Connect provider
(tests/fixtures/idp/server.mjs: the `oidc-provider` npm package, whose own development login and
consent pages people sign in on), and Debian's chromium, headless, driven through Debian's
chromedriver by Selenium. Each person has a browser of their own (their own cookies).

People (IDP_ACCOUNTS): alice and erin approve for acme, bob approves for globex, carol is in acme
without the approve scope, dave is acme's agent user who asks for the calls, and olga approves
and administers acme (emergency denies).

Every wait is bounded (WebDriverWait, the audit helper); nothing sleeps to synchronize.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import anyio
import grpc
import httpx2
import pytest
import toolgate_process
from conftest import DEFAULT_RPC_DEADLINE_S, ReflectedApi, _identity
from mcp import Client
from mcp import types as mcp_types
from mcp.client.streamable_http import streamable_http_client
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

REPO_ROOT = toolgate_process.REPO_ROOT
CHROMIUM = os.environ.get("TOOLGATE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TOOLGATE_CHROMEDRIVER", "/usr/bin/chromedriver")
WAIT_S = 20
CLIENT_SECRET = "console-secret-0123456789abcdef0123"
ACCOUNTS = {
    "alice": {"tenant": "acme", "toolgate_scopes": "toolgate:approve"},
    "erin": {"tenant": "acme", "toolgate_scopes": "toolgate:approve"},
    "bob": {"tenant": "globex", "toolgate_scopes": "toolgate:approve"},
    "carol": {"tenant": "acme", "toolgate_scopes": "tickets:read"},
    "dave": {"tenant": "acme", "toolgate_scopes": "toolgate:approve payments:write"},
    "olga": {"tenant": "acme", "toolgate_scopes": "toolgate:approve toolgate:admin"},
}



@pytest.fixture(scope="module", autouse=True)
def _browser_installed():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing or not shutil.which("node"):
        pytest.fail(
            f"missing {missing or 'node'}: install Debian's chromium and chromium-driver (.ci/run does)",
            pytrace=False,
        )


# --- the parts ------------------------------------------------------------------------------------


class Idp:
    """tests/fixtures/idp/server.mjs on a loopback port, with the people above."""

    def __init__(self):
        self.process = subprocess.Popen(
            ["node", str(REPO_ROOT / "tests" / "fixtures" / "idp" / "server.mjs")],
            env={**os.environ, "PORT": "0", "IDP_ACCOUNTS": json.dumps(ACCOUNTS)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = _read_line_within(self.process, 60)
        assert line.startswith("listening on "), line
        self.issuer = f"http://127.0.0.1:{int(line.split()[-1])}"

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            self.issuer + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def mint(self, subject: str, audience: str) -> str:
        return self.post("/test/mint", {"sub": subject, "aud": audience, **ACCOUNTS[subject]})["token"]

    def stop(self):
        self.process.kill()
        self.process.wait(timeout=10)


def _read_line_within(process: subprocess.Popen, seconds: float) -> str:
    """The child's first stdout line, or a failure after `seconds`."""
    result: list[str] = []

    def read():
        result.append(process.stdout.readline())

    import threading

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(seconds)
    if not result or not result[0]:
        process.kill()
        pytest.fail(f"the identity provider did not start within {seconds}s", pytrace=False)
    return result[0].strip()


CATALOG = """
version: 1
server:
  listen: "127.0.0.1:0"
  mcp:
    listen: "127.0.0.1:0"
  console:
    listen: "127.0.0.1:0"
    session_ttl: 10m
    oidc:
      issuer: "{issuer}"
      client_id: console
      client_secret_file: console-secret
      scopes: [toolgate]
identity:
  jwt:
    jwks: {{ discover: "{issuer}" }}
    audience: [toolgate]
    claims: {{ scopes: toolgate_scopes }}
approvals:
  risk_levels: [write_confirmed]
  ttl: 5m
audit:
  sink: stdout
tenants:
  acme: {{}}
  globex: {{}}
agents:
  "*":
    allow: ["*"]
tools:
  - name: refund_order
    description: Refunds an order.
    risk_level: write_confirmed
    timeout: 5s
    executor: {{ builtin: refund_order }}
    redact: [/card_last4]
    input_schema:
      type: object
      properties:
        order_id: {{ type: string }}
        amount_cents: {{ type: integer }}
        card_last4: {{ type: string }}
      required: [order_id, amount_cents]
      additionalProperties: false
"""


@pytest.fixture(scope="module")
def idp():
    provider = Idp()
    yield provider
    provider.stop()


@pytest.fixture(scope="module")
def sidecar(idp, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    (tmp / "console-secret").write_text(CLIENT_SECRET + "\n")
    config = tmp / "catalog.yaml"
    config.write_text(CATALOG.format(issuer=idp.issuer))
    server = toolgate_process.start(args=("--config", str(config)))
    assert server.console_address, f"no console in the log:\n{server.stderr_text()}"
    # The console's address is known only now: register it as a client with its redirect URI.
    idp.post(
        "/test/clients",
        {
            "client_id": "console",
            "client_secret": CLIENT_SECRET,
            "grant_types": ["authorization_code"],
            "response_types": ["code"],
            "redirect_uris": [f"http://{server.console_address}/callback"],
        },
    )
    yield server
    code = toolgate_process.stop(server)
    assert code == 0, f"toolgate exited with {code}; stderr:\n{server.stderr_text()}"


@pytest.fixture(scope="module")
def api(sidecar):
    channel = grpc.insecure_channel(sidecar.address)
    grpc.channel_ready_future(channel).result(timeout=DEFAULT_RPC_DEADLINE_S)
    with channel:
        yield ReflectedApi(channel)


def new_browser(width: int = 1100, height: int = 900) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # as root
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--window-size={width},{height}",
        f"--user-data-dir={tempfile.mkdtemp(prefix='toolgate-chromium-')}",
    ):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    browser.set_page_load_timeout(WAIT_S)
    return browser


@pytest.fixture
def browsers():
    """Opens browsers on demand (one per person); quits them all after the test."""
    opened: list[webdriver.Chrome] = []

    def open_one(**kwargs) -> webdriver.Chrome:
        browser = new_browser(**kwargs)
        opened.append(browser)
        return browser

    yield open_one
    for browser in opened:
        browser.quit()


def wait(browser, condition, what: str):
    return WebDriverWait(browser, WAIT_S).until(condition, message=f"waited {WAIT_S}s for {what}")


def console_url(sidecar, path: str = "/approvals") -> str:
    return f"http://{sidecar.console_address}{path}"


def sign_in(browser, sidecar, login: str, path: str = "/approvals"):
    """Opens `path`, signs in as `login` on the provider's own pages, and lands back on `path`."""
    browser.get(console_url(sidecar, path))
    wait(browser, ec.element_to_be_clickable((By.PARTIAL_LINK_TEXT, "Sign in with")), "the sign-in page").click()
    login_at_the_provider(browser, login)
    back_at(browser, console_url(sidecar, "/"))
    wait(browser, lambda b: b.current_url == console_url(sidecar, path), f"landing on {path}")
    who = wait(browser, ec.presence_of_element_located((By.CSS_SELECTOR, "header .who")), "the signed-in frame")
    assert login in who.text


def back_at(browser, prefix: str):
    """Consents at the provider if it asks (once per person and client), until the browser is back
    at a URL starting with `prefix`."""

    def consent_or_back(b):
        if b.current_url.startswith(prefix):
            return "back"
        if b.find_elements(By.CSS_SELECTOR, "input[name=prompt][value=consent]"):
            return "consent"
        return None

    if wait(browser, consent_or_back, "the consent page or the console") == "consent":
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait(browser, lambda b: b.current_url.startswith(prefix), "the console")


def login_at_the_provider(browser, login: str):
    wait(browser, ec.presence_of_element_located((By.NAME, "login")), "the provider's login page")
    browser.find_element(By.NAME, "login").send_keys(login)
    browser.find_element(By.NAME, "password").send_keys("any password")
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def execute(api: ReflectedApi, token: str, arguments: dict, approval_id: str = "", run_id: str = "run-1"):
    request_cls, call = api.unary("toolgate.v1.ToolGate", "ExecuteTool")
    request = request_cls(run_id=run_id, step=1)
    request.call.call_id = f"call-{uuid.uuid4().hex[:8]}"
    request.call.name = "refund_order"
    request.call.arguments_json = json.dumps(arguments)
    request.call.approval_id = approval_id
    return call(request, metadata=(("authorization", f"Bearer {token}"),), timeout=DEFAULT_RPC_DEADLINE_S).result


def ask(api, idp, amount: int = 2500, run_id: str = "run-1", **extra) -> str:
    """dave's agent asks for a refund over gRPC; the approval's id."""
    result = execute(api, idp.mint("dave", "toolgate"), {"order_id": "A-1", "amount_cents": amount, **extra}, run_id=run_id)
    assert result.error_type == "approval_required", (result.error_type, result.error_message)
    return result.approval_id


def get_approval(api, idp, approval_id: str, who: str = "erin"):
    """The approval as the gRPC door's GetApproval returns it to an approver."""
    request_cls, call = api.unary("toolgate.v1.Approvals", "GetApproval")
    return call(
        request_cls(approval_id=approval_id),
        metadata=(("authorization", f"Bearer {idp.mint(who, 'toolgate')}"),),
        timeout=DEFAULT_RPC_DEADLINE_S,
    ).approval


def approval_state(api, idp, approval_id: str, who: str = "erin") -> str:
    states = api.pool.FindEnumTypeByName("toolgate.v1.ApprovalState")
    return states.values_by_number[get_approval(api, idp, approval_id, who).state].name


def post_form(browser, sidecar, path: str, fields: dict, origin: str | None = "same") -> tuple[int, str]:
    """A form post with the browser's session cookie, sent outside the browser (as an attacker
    holding the cookie, or a stale tab, would)."""
    cookies = "; ".join(f"{c['name']}={c['value']}" for c in browser.get_cookies())
    headers = {"cookie": cookies, "content-type": "application/x-www-form-urlencoded"}
    if origin == "same":
        headers["origin"] = f"http://{sidecar.console_address}"
    elif origin is not None:
        headers["origin"] = origin
    request = urllib.request.Request(
        console_url(sidecar, path), data=urllib.parse.urlencode(fields).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def page_csrf(browser) -> str:
    return browser.find_element(By.CSS_SELECTOR, "form.who input[name=csrf]").get_attribute("value")


# --- the tests ------------------------------------------------------------------------------------


def test_an_approver_signs_in_at_the_provider_and_approves_what_an_agent_asked_for(sidecar, idp, api, browsers):
    approval_id = ask(api, idp, card_last4="4242")
    alice = browsers()
    sign_in(alice, sidecar, "alice")
    card = wait(
        alice,
        ec.presence_of_element_located((By.CSS_SELECTOR, f"[data-approval='{approval_id}']")),
        "the request in the inbox",
    )
    text = card.text
    assert "refund_order" in text and "WRITE_CONFIRMED" in text and "dave" in text, text
    assert "run-1" in text, text
    # As the audit log shows them: the catalog's redact applies.
    assert "4242" not in text and "[redacted]" in text, text
    # The gRPC door shows the same arguments, redacted alike.
    over_grpc = json.loads(get_approval(api, idp, approval_id).arguments_json)
    assert over_grpc == {"amount_cents": 2500, "card_last4": "[redacted]", "order_id": "A-1"}, over_grpc
    card.find_element(By.CSS_SELECTOR, "h2 a").click()
    wait(alice, ec.presence_of_element_located((By.ID, "reason")), "the decision form")
    assert "4242" not in alice.page_source
    # Keyboard only: type the reason, Tab to Approve, press Enter.
    reason = alice.find_element(By.ID, "reason")
    reason.send_keys("customer called; order checked")
    reason.send_keys(Keys.TAB)
    assert alice.switch_to.active_element.text == "Approve"
    alice.switch_to.active_element.send_keys(Keys.ENTER)
    notice = wait(alice, ec.presence_of_element_located((By.CSS_SELECTOR, ".notice.ok")), "the decision's result")
    assert "You approved this request" in notice.text
    assert "Approved by alice" in alice.find_element(By.CSS_SELECTOR, ".state").text
    # The agent's repeat call, with the approval, runs.
    repeat = execute(
        api, idp.mint("dave", "toolgate"), {"order_id": "A-1", "amount_cents": 2500, "card_last4": "4242"}, approval_id
    )
    assert repeat.error_type == "", (repeat.error_type, repeat.error_message)
    assert json.loads(repeat.model_text)["status"] == "refunded"
    events = sidecar.wait_for_audit_events(
        lambda evs: any(e.get("kind") == "approval_decision" and e.get("approval_id") == approval_id for e in evs)
    )
    decision = next(e for e in events if e.get("kind") == "approval_decision" and e.get("approval_id") == approval_id)
    assert decision["door"] == "console"
    assert decision["approver"] == "alice"
    assert decision["status"] == "APPROVED"
    assert decision["reason"] == "customer called; order checked"
    # No credential of the sign-in reaches the audit log or the sidecar's logs: not the session
    # cookie or its seal, not the client secret.
    session = next(c["value"] for c in alice.get_cookies() if c["name"] == "toolgate-console")
    records = "".join(sidecar.stdout_lines) + sidecar.stderr_text()
    for secret in (session, session.split(".")[-1], CLIENT_SECRET):
        assert secret not in records, f"{secret[:12]}… appears in the audit log or the logs"


def test_the_open_inbox_follows_decisions_made_elsewhere_and_new_requests(sidecar, idp, api, browsers):
    first = ask(api, idp, amount=3100, run_id="run-live")
    alice = browsers()
    sign_in(alice, sidecar, "alice")
    wait(alice, ec.presence_of_element_located((By.CSS_SELECTOR, f"[data-approval='{first}']")), "the first request")
    # A mark on this very page: gone if the page were loaded again.
    alice.execute_script("window.__stillThisPage = true;")
    second = ask(api, idp, amount=3200, run_id="run-live")
    wait(alice, ec.presence_of_element_located((By.CSS_SELECTOR, f"[data-approval='{second}']")), "the new request")
    # Newest first.
    listed = [el.get_attribute("data-approval") for el in alice.find_elements(By.CSS_SELECTOR, "[data-approval]")]
    assert listed.index(second) < listed.index(first)
    # erin rejects the first one with the CLI's service (the gRPC Approvals service).
    request_cls, call = api.unary("toolgate.v1.Approvals", "DecideApproval")
    call(
        request_cls(
            approval_id=first,
            decision=api.enum_value("toolgate.v1.ApprovalDecision", "APPROVAL_DECISION_REJECT"),
            reason="duplicate",
        ),
        metadata=(("authorization", f"Bearer {idp.mint('erin', 'toolgate')}"),),
        timeout=DEFAULT_RPC_DEADLINE_S,
    )
    wait(alice, ec.invisibility_of_element_located((By.CSS_SELECTOR, f"[data-approval='{first}']")), "the decided request to leave")
    assert alice.execute_script("return window.__stillThisPage === true;"), "the page was reloaded"
    # The decided page says who, when and why.
    alice.find_element(By.LINK_TEXT, "Decided").click()
    row = wait(alice, ec.presence_of_element_located((By.XPATH, f"//a[@href='/approvals/{first}']/ancestor::tr")), "the rejection")
    assert "erin" in row.text and "duplicate" in row.text and "UTC" in row.text, row.text


def test_the_mcp_doors_url_elicitation_opens_that_approvals_page(sidecar, idp, api, browsers):
    alice = browsers()
    sign_in(alice, sidecar, "alice")
    resource = f"http://{sidecar.mcp_address}/mcp"
    asked: list[str] = []

    def decide_in_the_browser(url: str):
        alice.get(url)
        wait(alice, ec.presence_of_element_located((By.ID, "reason")), "the elicited approval's page")
        alice.find_element(By.CSS_SELECTOR, "button.approve").click()
        wait(alice, ec.presence_of_element_located((By.CSS_SELECTOR, ".notice.ok")), "the approval")

    async def person_opens_the_url(context, params):
        assert params.mode == "url", params
        asked.append(params.url)
        await anyio.to_thread.run_sync(decide_in_the_browser, params.url)
        return mcp_types.ElicitResult(action="accept")

    async def body():
        http = httpx2.AsyncClient(headers={"authorization": f"Bearer {idp.mint('dave', resource)}"}, timeout=30)
        client = Client(
            streamable_http_client(resource, http_client=http), mode="auto", cache=None,
            elicitation_callback=person_opens_the_url,
        )
        async with client:
            return await client.call_tool("refund_order", {"order_id": "A-7", "amount_cents": 7000})

    async def bounded():
        with anyio.fail_after(90):
            return await body()

    result = anyio.run(bounded)
    assert len(asked) == 1
    approval_id = asked[0].rsplit("/", 1)[-1]
    # The console's own page of that approval: the door's approvals_url defaults to it.
    assert asked[0] == console_url(sidecar, f"/approvals/{approval_id}")
    assert result.is_error is False, result.content[0].text
    assert approval_state(api, idp, approval_id) == "APPROVAL_STATE_USED"


def test_another_tenant_sees_nothing_of_it(sidecar, idp, api, browsers):
    approval_id = ask(api, idp, amount=4100)
    bob = browsers()
    sign_in(bob, sidecar, "bob")
    assert not bob.find_elements(By.CSS_SELECTOR, f"[data-approval='{approval_id}']")
    assert "globex" in bob.find_element(By.CSS_SELECTOR, "header .who").text
    bob.get(console_url(sidecar, f"/approvals/{approval_id}"))
    heading = wait(bob, ec.presence_of_element_located((By.TAG_NAME, "h1")), "the answer")
    assert heading.text == "No such approval"
    assert "refund_order" not in bob.page_source and "dave" not in bob.page_source
    status, page = post_form(bob, sidecar, f"/approvals/{approval_id}", {"csrf": page_csrf(bob), "decision": "approve"})
    assert status == 404, page
    assert approval_state(api, idp, approval_id) == "APPROVAL_STATE_PENDING"


def test_without_the_approve_scope_nothing_is_shown_or_decided(sidecar, idp, api, browsers):
    approval_id = ask(api, idp, amount=4200)
    carol = browsers()
    sign_in(carol, sidecar, "carol")
    heading = carol.find_element(By.TAG_NAME, "h1")
    assert heading.text == "Not an approver"
    assert "toolgate:approve" in carol.page_source
    assert approval_id not in carol.page_source
    status, page = post_form(carol, sidecar, f"/approvals/{approval_id}", {"csrf": page_csrf(carol), "decision": "approve"})
    assert status == 403 and "Not an approver" in page, (status, page)
    assert approval_state(api, idp, approval_id) == "APPROVAL_STATE_PENDING"


def test_the_requester_cannot_approve_their_own_call(sidecar, idp, api, browsers):
    approval_id = ask(api, idp, amount=4300)
    dave = browsers()
    sign_in(dave, sidecar, "dave", f"/approvals/{approval_id}")
    assert "You asked for this call" in dave.page_source
    assert not dave.find_elements(By.CSS_SELECTOR, "form.decide")
    # Sent anyway, the boundary refuses it: the form's absence is a courtesy, not the rule.
    status, page = post_form(dave, sidecar, f"/approvals/{approval_id}", {"csrf": page_csrf(dave), "decision": "approve"})
    assert status == 403 and "cannot approve their own request" in page, (status, page)
    assert approval_state(api, idp, approval_id) == "APPROVAL_STATE_PENDING"


def test_forged_stale_and_signed_out_posts_decide_nothing(sidecar, idp, api, browsers):
    approval_id = ask(api, idp, amount=4400)
    alice = browsers()
    sign_in(alice, sidecar, "alice", f"/approvals/{approval_id}")
    csrf = page_csrf(alice)
    path = f"/approvals/{approval_id}"
    for fields, origin in (
        ({"csrf": "forged", "decision": "approve"}, "same"),
        ({"decision": "approve"}, "same"),
        ({"csrf": csrf, "decision": "approve"}, "https://evil.example"),
        ({"csrf": csrf, "decision": "approve"}, None),
    ):
        status, page = post_form(alice, sidecar, path, fields, origin)
        assert status == 403 and "Form not accepted" in page, (fields, origin, status)
    assert approval_state(api, idp, approval_id) == "APPROVAL_STATE_PENDING"
    # Signed out, the same cookie and token decide nothing, and the page says what to do.
    stale_cookies = alice.get_cookies()
    alice.find_element(By.CSS_SELECTOR, "form.who button").click()
    wait(alice, lambda b: "Signed out" in b.page_source, "the sign-out")
    for cookie in stale_cookies:
        alice.add_cookie(cookie)
    status, page = post_form(alice, sidecar, path, {"csrf": csrf, "decision": "approve"})
    assert status == 401 and "Nothing was decided" in page, (status, page)
    assert approval_state(api, idp, approval_id) == "APPROVAL_STATE_PENDING"


def test_emergency_denies_show_read_only_to_the_tenants_admins(sidecar, idp, api, browsers):
    request_cls, call = api.unary("toolgate.v1.Controls", "SetEmergencyDeny")
    call(
        request_cls(tools="refund_*", tenant="acme", reason="refunds paused for the audit", ttl_seconds=600),
        metadata=(("authorization", f"Bearer {idp.mint('olga', 'toolgate')}"),),
        timeout=DEFAULT_RPC_DEADLINE_S,
    )
    try:
        olga = browsers()
        sign_in(olga, sidecar, "olga", "/decided")
        table = wait(olga, ec.presence_of_element_located((By.CSS_SELECTOR, "table.denies")), "the denies")
        assert "refund_*" in table.text and "refunds paused for the audit" in table.text, table.text
        assert "olga" in table.text
        assert not olga.find_elements(By.CSS_SELECTOR, "table.denies form, table.denies button")
        alice = browsers()
        sign_in(alice, sidecar, "alice", "/decided")
        assert "Emergency denies" not in alice.page_source
        assert "refund_*" not in alice.page_source
    finally:
        request_cls, call = api.unary("toolgate.v1.Controls", "ListEmergencyDenies")
        admin = (("authorization", f"Bearer {idp.mint('olga', 'toolgate')}"),)
        for deny in call(request_cls(), metadata=admin, timeout=DEFAULT_RPC_DEADLINE_S).denies:
            clear_cls, clear = api.unary("toolgate.v1.Controls", "ClearEmergencyDeny")
            clear(clear_cls(deny_id=deny.deny_id), metadata=admin, timeout=DEFAULT_RPC_DEADLINE_S)


def test_an_identity_provider_that_is_down_gets_a_clear_page(sidecar, idp, browsers):
    idp.post("/test/mode", {"token": "down"})
    try:
        erin = browsers()
        erin.get(console_url(sidecar))
        wait(erin, ec.presence_of_element_located((By.PARTIAL_LINK_TEXT, "Sign in with")), "the sign-in page").click()
        login_at_the_provider(erin, "erin")
        back_at(erin, console_url(sidecar, "/callback"))
        heading = erin.find_element(By.TAG_NAME, "h1")
        assert heading.text == "Sign-in failed"
        assert "cannot be reached" in erin.page_source and "503" in erin.page_source
        assert not erin.find_elements(By.CSS_SELECTOR, "header .who")
    finally:
        idp.post("/test/mode", {"token": "normal"})


def test_the_demo_console_on_a_phone_and_its_weight(tmp_path, browsers):
    """The demo's console (development sign-in), as a phone shows it. With
    TOOLGATE_CONSOLE_SCREENSHOT=PATH the inbox is saved there (docs/console-inbox.png was made so)."""
    demo = toolgate_process.start()
    try:
        assert demo.console_address
        channel = grpc.insecure_channel(demo.address)
        grpc.channel_ready_future(channel).result(timeout=DEFAULT_RPC_DEADLINE_S)
        with channel:
            api = ReflectedApi(channel)
            request_cls, call = api.unary("toolgate.v1.ToolGate", "ExecuteTool")
            for name, args, subject in (
                ("refund_order", {"order_id": "A-1001", "amount_cents": 2500}, "alice"),
                ("delete_ticket", {"ticket_id": "T-12"}, "carol"),
            ):
                request = request_cls(run_id=f"run-{subject}", step=1)
                request.call.call_id = "c1"
                request.call.name = name
                request.call.arguments_json = json.dumps(args)
                metadata = _identity(subject=subject, agent="support-agent", scopes=("tickets:write",))
                result = call(request, metadata=metadata, timeout=DEFAULT_RPC_DEADLINE_S).result
                assert result.error_type == "approval_required", result.error_message
        phone = browsers(width=390, height=844)
        phone.get(f"http://{demo.console_address}/approvals")
        assert "Development sign-in" in phone.page_source
        wait(phone, ec.element_to_be_clickable((By.CSS_SELECTOR, "form.dev-sign-in button")), "the dev form").click()
        wait(phone, lambda b: len(b.find_elements(By.CSS_SELECTOR, "[data-approval]")) == 2, "both requests")
        wait(phone, lambda b: "in 4m" in b.find_element(By.CSS_SELECTOR, "time[data-countdown]").text, "the countdown")
        # Nothing wider than the phone, and nothing loaded from anywhere but the sidecar.
        assert phone.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        origin = f"http://{demo.console_address}"
        resources = phone.execute_script(
            "return performance.getEntriesByType('resource').map(r => [r.name, r.transferSize])"
        )
        assert resources and all(name.startswith(origin) for name, _ in resources), resources
        weight = phone.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            "return n.transferSize + performance.getEntriesByType('resource').reduce((s, r) => s + r.transferSize, 0)"
        )
        assert 0 < weight < 32 * 1024, weight
        destination = os.environ.get("TOOLGATE_CONSOLE_SCREENSHOT")
        phone.set_window_size(900, 760)
        phone.save_screenshot(destination or str(tmp_path / "inbox.png"))
    finally:
        code = toolgate_process.stop(demo)
        assert code == 0, demo.stderr_text()
