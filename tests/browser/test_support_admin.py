"""A Support user in headless Chromium (Debian's package): find, cancel, audit, operations;
and what the back office looks like at 1,400 x 900 and on a 1,280 x 720 laptop screen."""

import importlib
import re
import shutil
from pathlib import Path

import pytest
from django.apps import apps
from django.contrib.auth.models import Group

from payments import services
from payments.engine import executor
from payments.models import Payment
from tests.factories import AccountFactory, UserFactory
from tests.payments.helpers import make_due, sweep

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"  # every time in the admin: seconds and zone
WINDOWS = ((1400, 900), (1280, 720))

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path):
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail(
            "Debian's chromium and chromium-driver are required (scripts/test installs them)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.save_screenshot(str(tmp_path / "last.png"))
    driver.quit()


@pytest.fixture
def support_user():
    if not Group.objects.filter(name="Support").exists():  # a flushed transactional database
        migration = importlib.import_module("payments.migrations.0006_support_group")
        migration.create_support_group(apps, None)
    user = UserFactory(username="sam", is_staff=True)
    user.set_password("correct horse battery")
    user.save()
    user.groups.add(Group.objects.get(name="Support"))
    return user


def test_support_user_cancels_a_payment_and_sees_the_audit_and_operations(
    browser, live_server, support_user
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    owner = UserFactory(username="alice")
    source = AccountFactory(owner=owner, funded=1_000)
    target = AccountFactory(owner=owner)
    payment = services.payment_schedule(
        client=owner,
        from_account_id=source.pk,
        to_account_id=target.pk,
        amount=125,
        delay_seconds=3600,
    )
    other = services.payment_schedule(
        client=owner,
        from_account_id=source.pk,
        to_account_id=target.pk,
        amount=5,
        delay_seconds=3600,
    )

    browser.get(f"{live_server.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("sam")
    browser.find_element(By.NAME, "password").send_keys("correct horse battery")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # a click does not wait for the next page: wait for it explicitly
    WebDriverWait(browser, 10).until(lambda d: "/admin/login/" not in d.current_url)
    assert "Site administration" in browser.page_source

    browser.get(f"{live_server.url}/admin/payments/payment/")
    search = browser.find_element(By.ID, "searchbar")
    search.send_keys(str(payment.pk))
    search.submit()
    WebDriverWait(browser, 10).until(lambda d: "q=" in d.current_url)
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 1 and str(payment.pk)[:8] in rows[0].text  # the short id

    rows[0].find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("cancel_payments")
    browser.find_element(By.NAME, "index").click()
    message = WebDriverWait(browser, 10).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".messagelist")
    )
    assert "1 payment(s) cancelled" in message[0].text

    browser.get(f"{live_server.url}/admin/payments/payment/{payment.pk}/change/")
    status = browser.find_element(By.CSS_SELECTOR, ".field-status .readonly").text
    assert status == "CANCELLED"
    events = browser.find_element(By.ID, "events-group").text
    assert "cancelled" in events and "sam" in events

    payment.refresh_from_db()
    other.refresh_from_db()
    assert payment.status == "CANCELLED" and other.status == "PENDING"
    assert payment.events.get(type="cancelled").actor_user == support_user

    browser.get(f"{live_server.url}/admin/operations/")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Operations"
    drawn = browser.execute_script(
        """
        return ['backlog-chart', 'executed-chart', 'failed-chart'].map(id => {
            const svg = document.getElementById(id);
            const box = svg.getBoundingClientRect();
            return [id, box.width, box.height, svg.querySelectorAll('rect').length];
        });
        """
    )
    for chart_id, width, height, bars in drawn:
        assert width > 100 and height > 50 and bars > 0, chart_id
    backlog_heights = browser.execute_script(
        "return [...document.querySelectorAll('#backlog-chart rect')].map(r => r.getBBox().height)"
    )
    assert max(backlog_heights) > 0  # the open payment is drawn
    assert Payment.objects.filter(status="PENDING").count() == 1


def log_in(browser, live_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{live_server.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("sam")
    browser.find_element(By.NAME, "password").send_keys("correct horse battery")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 10).until(lambda d: "/admin/login/" not in d.current_url)


def window(browser, width, height):
    """Resize so the page's viewport (what the layout sees) is ``width`` x ``height``."""
    browser.set_window_size(width, height)
    inner = browser.execute_script("return [window.innerWidth, window.innerHeight]")
    browser.set_window_size(2 * width - inner[0], 2 * height - inner[1])
    assert browser.execute_script("return window.innerWidth") == width


def no_horizontal_scroll(browser):
    return browser.execute_script(
        "const root = document.documentElement; return root.scrollWidth <= root.clientWidth"
    )


# Every chart on the operations page: its title, axis labels, and whether the
# chart and each of its labels lie inside the card that holds it.
CHARTS_JS = """
return [...document.querySelectorAll('figure.ops-chart')].map(figure => {
    const card = figure.closest('.ops-card').getBoundingClientRect();
    const inside = el => { const b = el.getBoundingClientRect();
        return b.left >= card.left - 0.5 && b.right <= card.right + 0.5
            && b.top >= card.top - 0.5 && b.bottom <= card.bottom + 0.5; };
    const svg = figure.querySelector('svg');
    const texts = [...figure.querySelectorAll('figcaption, .chart-y-label, .chart-x-label,'
                                              + ' .chart-y-ticks span, .chart-x-ticks span')];
    return {
        id: svg.id,
        title: figure.querySelector('figcaption').textContent.trim(),
        y_label: figure.querySelector('.chart-y-label').textContent.trim(),
        x_label: figure.querySelector('.chart-x-label').textContent.trim(),
        y_ticks: [...figure.querySelectorAll('.chart-y-ticks span')].map(e => e.textContent),
        x_ticks: [...figure.querySelectorAll('.chart-x-ticks span')].map(e => e.textContent),
        width: svg.getBoundingClientRect().width,
        height: svg.getBoundingClientRect().height,
        bars: svg.querySelectorAll('rect.bar').length,
        outside: [svg, ...texts].filter(el => !inside(el)).map(el => el.outerHTML.slice(0, 80)),
        overlapping: texts.filter((a, i) => texts.slice(i + 1).some(b => {
            const p = a.getBoundingClientRect(), q = b.getBoundingClientRect();
            return p.width && q.width && p.left < q.right && q.left < p.right
                && p.top < q.bottom && q.top < p.bottom; })).map(el => el.textContent),
    };
});
"""


def test_back_office_reads_like_a_support_tool(
    browser, live_server, support_user, monkeypatch, tmp_path
):
    """Payments list, times, statement and charts, at 1,400 x 900 and 1,280 x 720."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    owner = UserFactory(username="alice")
    source = AccountFactory(owner=owner, funded=100_000, name="Alice operating")
    target = AccountFactory(owner=owner, name="Alice savings")
    schedule = {
        delay: services.payment_schedule(
            client=owner,
            from_account_id=source.pk,
            to_account_id=target.pk,
            amount=1_250,
            delay_seconds=delay,
            description=f"due in {delay} s",
        )
        for delay in (60, 600, 7_200, 90_000)
    }
    executed = schedule[60]
    make_due(executed.pk, seconds_ago=2)
    _, published = sweep(monkeypatch)
    executor.execute_chunk(published.items())
    executed.refresh_from_db()
    assert executed.status == "COMPLETED"
    newest_due_first = [str(p.pk)[:8] for _, p in sorted(schedule.items(), reverse=True)]

    log_in(browser, live_server)
    # Every column at 1,400 px; on a 1,280 px laptop at least these (the rest scroll sideways).
    core = ["payment", "status", "amount", "from", "to", "due at", "executed at", "late by"]
    for width, height in WINDOWS:
        columns = [*core, "error code", "attempts"] if width >= 1400 else core
        window(browser, width, height)
        browser.get(f"{live_server.url}/admin/payments/payment/")
        # Visible without scrolling: inside the window and inside the results box
        # (which scrolls sideways on its own when the table is wider).
        headers = browser.execute_script(
            """const box = document.querySelector('#changelist .results').getBoundingClientRect();
            const right = Math.min(box.right, document.documentElement.clientWidth);
            return [...document.querySelectorAll('#result_list thead th')].map(th => [
                th.textContent.trim().toLowerCase(), th.getBoundingClientRect().right <= right])"""
        )
        hidden = [name for name, inside in headers if name in columns and not inside]
        assert not hidden and {name for name, _ in headers} >= set(columns), (width, headers)
        rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
        assert [r.find_element(By.CSS_SELECTOR, ".field-short_id").text for r in rows] == (
            newest_due_first
        )
        # Short ids, times and amounts stay on one line.
        wrapped = browser.execute_script(
            """return [...document.querySelectorAll(
                '#result_list td.field-short_id, #result_list td.field-due_at,'
                + ' #result_list td.field-executed_at, #result_list td.field-late_by,'
                + ' #result_list td.field-amount_display')]
                .filter(td => { const r = document.createRange(); r.selectNodeContents(td);
                    const size = parseFloat(getComputedStyle(td).fontSize);
                    return r.getBoundingClientRect().height >= 2 * size; })
                .map(td => td.className + ': ' + td.textContent)"""
        )
        assert not wrapped, wrapped
        assert no_horizontal_scroll(browser)
        browser.save_screenshot(str(tmp_path / f"payments-{width}.png"))
    cells = {
        r.find_element(By.CSS_SELECTOR, ".field-short_id").text: r
        for r in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    }
    done = cells[str(executed.pk)[:8]]
    assert re.fullmatch(TIME, done.find_element(By.CSS_SELECTOR, ".field-due_at").text)
    assert re.fullmatch(TIME, done.find_element(By.CSS_SELECTOR, ".field-executed_at").text)
    late_by = done.find_element(By.CSS_SELECTOR, ".field-late_by").text
    assert re.fullmatch(r"[\d,]+\.\d ms", late_by), late_by
    assert cells[newest_due_first[0]].find_element(By.CSS_SELECTOR, ".field-late_by").text == "-"

    # The payment's own page: every time to the second, with its zone.
    browser.get(f"{live_server.url}/admin/payments/payment/{executed.pk}/change/")
    for field in ("due_at", "executed_at", "created_at"):
        text = browser.find_element(By.CSS_SELECTOR, f".field-{field} .readonly").text
        assert re.fullmatch(TIME, text), (field, text)
    event_cells = browser.find_elements(By.CSS_SELECTOR, "#events-group td.field-created_at")
    event_times = [td.text for td in event_cells]
    assert event_times and all(re.fullmatch(TIME, t) for t in event_times), event_times

    # The account statement is a table, linked to the payment that posted each line.
    browser.get(f"{live_server.url}/admin/ledger/account/{target.pk}/change/")
    table = browser.find_element(By.ID, "statement")
    headers = table.find_elements(By.CSS_SELECTOR, "thead th")
    assert [th.get_attribute("textContent") for th in headers] == [
        "Time",
        "Amount",
        "Balance after",
        "Description",
        "Payment",
    ]
    (row,) = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    time, amount, balance, description, link = (
        td.text for td in row.find_elements(By.TAG_NAME, "td")
    )
    assert re.fullmatch(TIME, time)
    assert (amount, balance, description) == ("+1,250", "1,250", "due in 60 s")
    assert link == f"payment {str(executed.pk)[:8]}"
    box = browser.execute_script(
        "const b = arguments[0].getBoundingClientRect(); return [b.right, window.innerWidth]",
        table,
    )
    assert box[0] <= box[1]
    browser.save_screenshot(str(tmp_path / "statement.png"))
    row.find_element(By.CSS_SELECTOR, "a.payment-link").click()
    WebDriverWait(browser, 10).until(lambda d: str(executed.pk) in d.current_url)

    # Operations: each chart has a title, axis labels and units, and fits its card.
    for width, height in WINDOWS:
        window(browser, width, height)
        browser.get(f"{live_server.url}/admin/operations/")
        charts = browser.execute_script(CHARTS_JS)
        assert {c["id"] for c in charts} >= {"backlog-chart", "executed-chart", "failed-chart"}
        for chart in charts:
            assert chart["title"] and chart["y_label"] and chart["x_label"], chart
            assert chart["width"] > 200 and chart["height"] > 100 and chart["bars"], chart
            assert not chart["outside"], (width, chart)
            assert not chart["overlapping"], (width, chart)
            assert chart["y_ticks"][0] == "0" and len(chart["x_ticks"]) >= 2, chart
        assert no_horizontal_scroll(browser), width
        browser.save_screenshot(str(tmp_path / f"operations-{width}.png"))
    page = browser.find_element(By.ID, "content").text
    assert re.search(r"As of " + TIME, page)
    lateness = browser.find_element(By.ID, "lateness").text
    p50 = re.search(r"p50\s+(\S+ ms)", lateness).group(1)
    assert re.fullmatch(r"[\d,]+\.\d ms", p50), lateness
