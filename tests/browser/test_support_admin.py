"""A Support user in headless Chromium (Debian's package): find, cancel, audit, operations."""

import importlib
import shutil
from pathlib import Path

import pytest
from django.apps import apps
from django.contrib.auth.models import Group

from payments import services
from payments.models import Payment
from tests.factories import AccountFactory, UserFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

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
    assert len(rows) == 1 and str(payment.pk) in rows[0].text

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
