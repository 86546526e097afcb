"""On a failing browser test, keep a screenshot of the page in tests/artifacts/ for debugging."""

from __future__ import annotations

import pytest


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def screenshot_on_failure(request):
    yield
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed and "page" in request.fixturenames:
        from tests.app.browser.test_browser import ARTIFACTS

        page = request.getfixturevalue("page")
        page.screenshot(path=ARTIFACTS / f"FAILED-{request.node.name}.png", full_page=True)
