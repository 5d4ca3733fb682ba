"""A person approving an OAuth client in Chromium: sign in to the console at the authorization
URL, approve the consent page, and follow the redirect back to the client."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_ARGS, _browser_or_fail


def approve(
    authorize_url: str,
    secret: str,
    profile: Path,
    *,
    callback: str,
    role: str | None = None,
    answer: bool = False,
) -> str:
    """The URL (under ``callback``) the browser was sent back to after approving, in
    ``role`` when given (else the page's default, the highest offered). ``answer``: the
    test answers the callback itself; else the client's own listener does."""
    sync_playwright = _browser_or_fail()
    back = re.compile("^" + re.escape(callback))
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        context.set_default_timeout(20_000)
        try:
            page = context.new_page()
            landed: list[str] = []
            if answer:

                def done(route: Any) -> None:
                    landed.append(route.request.url)
                    route.fulfill(status=200, body="done", content_type="text/plain")

                page.route(back, done)
            page.goto(authorize_url)
            page.fill("#token", secret)
            page.click("button[type=submit]")
            page.wait_for_selector("section.consent")
            if role is not None:
                page.select_option("#role", role)
            if not answer:
                with page.expect_navigation(url=back):
                    page.click("button[value=approve]")
                return str(page.url)
            page.click("button[value=approve]")
            for _ in range(200):  # the routed answer is not a navigation to wait for
                if landed:
                    return landed[0]
                page.wait_for_timeout(100)
            raise AssertionError("the consent never redirected to the client")
        finally:
            context.close()
