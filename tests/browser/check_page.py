#!/usr/bin/env python3
"""Check that every chart on a local HTML page rendered, as a user sees it.

The page is opened in headless Chromium and every <canvas> is read back
pixel by pixel: it is BLANK when fewer than 0.5% of its pixels are painted
or it holds fewer than 3 distinct colours.  Uncaught exceptions,
console.error/console.assert and errors the browser logs (failed loads,
...) are failures too.  The page must need no network: host names resolve
to nothing, so a CDN script fails to load and is reported.

Chromium is driven with its own DevTools Protocol (CDP) over
--remote-debugging-pipe: NUL-terminated JSON on fd 3 (commands) and fd 4
(replies and events).  The standard library has no websocket client, and
the browser's own protocol, not a DOM emulation, means that what is checked
is what a user's browser actually painted.

Usage: check_page.py PAGE.html [--expect-canvases N] [--screenshot OUT.png]
                     [--width 1400] [--timeout 60]
Exit status: 0 ok, 1 check failed, 2 usage error, 77 no Chromium found.
"""

import argparse
import base64
import fcntl
import json
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# The Debian binary itself: /usr/bin/chromium is a shell wrapper that adds
# flags of its own (extensions, GPU rasterization) from /etc/chromium.d.
BROWSERS = ('/usr/lib/chromium/chromium', 'chromium', 'chromium-browser',
            'google-chrome')
FLAGS = ['--headless=new', '--no-sandbox', '--disable-gpu', '--no-first-run',
         '--no-default-browser-check', '--remote-debugging-pipe',
         '--disable-background-networking', '--disable-component-update',
         '--disable-default-apps', '--disable-extensions', '--disable-sync',
         '--disable-domain-reliability', '--no-pings', '--mute-audio',
         '--disable-client-side-phishing-detection', '--hide-scrollbars',
         '--disable-features=Translate,MediaRouter,OptimizationHints',
         '--host-resolver-rules=MAP * ~NOTFOUND', '--disable-dev-shm-usage']

SIZES_JS = """Array.from(document.querySelectorAll('canvas'),
                         c => c.width > 0 && c.height > 0)"""
STATS_JS = r"""Array.from(document.querySelectorAll('canvas'), (c, i) => {
  let title = c.getAttribute('aria-label') || '';
  for (const h of title ? [] : document.querySelectorAll('h2, h3'))
    if (h.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_FOLLOWING)
      title = h.textContent.trim().replace(/\s+/g, ' ');
  const r = {id: c.id || '#' + i, title: title, w: c.width, h: c.height,
             painted: 0, colours: 0, error: ''};
  try {   // copy, so that 2d and webgl canvases read back alike
    const s = Object.assign(document.createElement('canvas'),
                            {width: c.width, height: c.height});
    const x = s.getContext('2d');
    x.drawImage(c, 0, 0);
    const d = x.getImageData(0, 0, c.width, c.height).data, seen = new Set();
    for (let p = 0; p < d.length; p += 4)
      if (d[p + 3] > 0) {
        r.painted++;
        seen.add((d[p] << 16) | (d[p + 1] << 8) | d[p + 2]);
      }
    r.colours = seen.size;
  } catch (e) { r.error = String(e); }
  const chart = window.Chart && Chart.getChart(c);   // the y axis as drawn, for the caller
  if (chart && chart.scales.y) r.y = [chart.scales.y.min, chart.scales.y.max];
  if (chart && chart.scales.x) r.x_ticks = chart.scales.x.ticks.map(t => t.value);
  return r;
})"""


class CheckError(Exception):
    """The check cannot go on (timeout, browser gone, protocol error)."""


class Browser:
    """A headless Chromium spoken to with CDP over a pair of pipes."""

    def __init__(self, exe, width, deadline):
        self.deadline, self.session, self.proc = deadline, None, None
        self.errors, self.events, self.buf, self.last_id = [], [], b'', 0
        self.profile = tempfile.mkdtemp(prefix='check_page.')
        cmd_r, self.cmd_w = os.pipe()
        self.resp_r, resp_w = os.pipe()

        def to_fds_3_and_4():   # via fds >= 10: the ends may be 3 or 4
            a = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(resp_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        try:
            self.proc = subprocess.Popen(
                [exe, *FLAGS, '--user-data-dir=' + self.profile,
                 '--window-size=%d,900' % width, 'about:blank'],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, pass_fds=(3, 4),
                preexec_fn=to_fds_3_and_4, start_new_session=True)
        except OSError:
            self.close()
            raise
        finally:
            os.close(cmd_r)
            os.close(resp_w)

    def close(self):
        """Close Chromium, kill its process group, remove the profile."""
        try:
            if self.proc:
                try:   # ask politely and wait for it to hang up
                    self.send('Browser.close', session=False, wait=2)
                    until = time.monotonic() + 2
                    while self._read(until) is not None:
                        pass
                except CheckError:
                    pass
                try:   # not reaped yet, so the group id is still its own
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        finally:
            os.close(self.cmd_w)
            os.close(self.resp_r)
            shutil.rmtree(self.profile, ignore_errors=True)

    def _read(self, until):
        """Read and handle one message; None if `until` passes first."""
        while b'\0' not in self.buf:
            left = until - time.monotonic()
            if left <= 0:
                return None
            if select.select([self.resp_r], [], [], left)[0]:
                chunk = os.read(self.resp_r, 1 << 20)
                if not chunk:
                    raise CheckError('Chromium exited')
                self.buf += chunk
        raw, self.buf = self.buf.split(b'\0', 1)
        msg = json.loads(raw)
        if 'method' in msg:
            self._event(msg['method'], msg.get('params', {}))
        return msg

    def _event(self, method, p):
        self.events.append(method)
        if method == 'Runtime.exceptionThrown':
            d = p['exceptionDetails']
            text = d.get('exception', {}).get('description') or d['text']
            self.errors.append('exception: %s (%s:%d)' % (
                text, d.get('url', ''), d.get('lineNumber', 0) + 1))
        elif (method == 'Runtime.consoleAPICalled'
              and p['type'] in ('error', 'assert')):
            self.errors.append('console.%s: %s' % (p['type'], ' '.join(
                str(a.get('value', a.get('description', '')))
                for a in p.get('args', []))))
        elif method == 'Log.entryAdded' and p['entry']['level'] == 'error':
            url = p['entry'].get('url', '')
            if not url.endswith('favicon.ico'):   # no error for file://
                self.errors.append('log: %s %s' % (p['entry']['text'], url))
        elif method in ('Inspector.targetCrashed', 'Target.targetCrashed'):
            raise CheckError('the page crashed')

    def send(self, method, params=None, session=True, wait=20):
        """Send a command (to the page's session) and return its result."""
        self.last_id += 1
        msg = {'id': self.last_id, 'method': method, 'params': params or {}}
        if session and self.session:
            msg['sessionId'] = self.session
        try:
            os.write(self.cmd_w, json.dumps(msg).encode() + b'\0')
        except OSError as e:
            raise CheckError('cannot talk to Chromium: %s' % e) from None
        until = time.monotonic() + wait
        while (reply := self._read(until)) is not None:
            if reply.get('id') == self.last_id:
                if 'error' in reply:
                    raise CheckError('%s: %s' % (method, reply['error']))
                return reply['result']
        raise CheckError('no reply to ' + method)

    def pump(self, seconds):
        """Handle events for `seconds`; False once the deadline passed."""
        until = min(time.monotonic() + seconds, self.deadline)
        while self._read(until) is not None:
            pass
        return time.monotonic() < self.deadline

    def evaluate(self, expression):
        res = self.send('Runtime.evaluate', {'expression': expression,
                                             'returnByValue': True})
        if 'exceptionDetails' in res:
            raise CheckError('evaluate: %s' % res['exceptionDetails'])
        return res['result'].get('value')


def check(page, args, exe):
    """Load the page; return (per-canvas stats, errors)."""
    b = Browser(exe, args.width, time.monotonic() + args.timeout)
    try:
        target = b.send('Target.createTarget', {'url': 'about:blank'})
        b.session = b.send('Target.attachToTarget', {
            'targetId': target['targetId'], 'flatten': True})['sessionId']
        for domain in ('Runtime', 'Log', 'Page'):
            b.send(domain + '.enable')
        b.send('Page.navigate', {'url': pathlib.Path(page).as_uri()})
        while 'Page.loadEventFired' not in b.events:
            if not b.pump(0.2):
                raise CheckError('the page never loaded')
        count, since = None, time.monotonic()
        while b.pump(0.2):   # the same count for 1 s, every canvas sized
            sizes = b.evaluate(SIZES_JS)
            if len(sizes) != count:
                count, since = len(sizes), time.monotonic()
            elif (all(sizes) and count >= args.expect_canvases
                  and time.monotonic() - since >= 1):
                break
        stats, previous = b.evaluate(STATS_JS), None
        while stats != previous and b.pump(0.5):   # animations are done
            previous, stats = stats, b.evaluate(STATS_JS)
        if args.screenshot:
            screenshot(b, args.width, args.screenshot)
        return stats, b.errors
    finally:
        b.close()


def screenshot(b, width, path):
    """Write a PNG of the whole page (at most 8000 px high)."""
    def resize(height):
        b.send('Emulation.setDeviceMetricsOverride', {
            'width': width, 'height': height, 'deviceScaleFactor': 1,
            'mobile': False})
        b.pump(1)   # responsive charts redraw at the new size

    resize(900)
    metrics = b.send('Page.getLayoutMetrics')
    size = metrics.get('cssContentSize') or metrics['contentSize']
    resize(min(int(size['height'] + 0.999), 8000))
    # The viewport holds the whole page now.  captureBeyondViewport=True
    # paints every <canvas> blank on a page taller than the viewport
    # (Chromium 156, --disable-gpu), so it stays off.
    shot = b.send('Page.captureScreenshot', {
        'format': 'png', 'captureBeyondViewport': False})
    with open(path, 'wb') as f:
        f.write(base64.b64decode(shot['data']))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('page')
    ap.add_argument('--expect-canvases', type=int, default=0, metavar='N')
    ap.add_argument('--screenshot', metavar='OUT.png')
    ap.add_argument('--width', type=int, default=1400)
    ap.add_argument('--timeout', type=float, default=60)
    args = ap.parse_args()
    page = os.path.abspath(args.page)
    if not os.path.isfile(page):
        print('check_page: no such file: %s' % args.page, file=sys.stderr)
        return 2
    exe = next(filter(None, map(shutil.which, BROWSERS)), None)
    if exe is None:
        print('check_page: no chromium found', file=sys.stderr)
        return 77
    signal.signal(signal.SIGTERM, lambda *_: sys.exit('check_page: killed'))
    try:
        stats, errors = check(page, args, exe)
    except CheckError as e:
        stats, errors = [], ['fatal: %s' % e]
    blank = 0
    for c in stats:
        painted = 100 * c['painted'] / max(c['w'] * c['h'], 1)
        ok = painted >= 0.5 and c['colours'] >= 3 and not c['error']
        blank += not ok
        y = ' y=[%g, %g]' % tuple(c['y']) if c.get('y') else ''
        if c.get('x_ticks') is not None:
            y += ' x_ticks=[%s]' % ', '.join('%g' % t for t in c['x_ticks'])
        print('canvas %s "%s" %dx%d painted=%.1f%% colours=%d%s %s' % (
            c['id'], c['title'], c['w'], c['h'], painted, c['colours'], y,
            'ok' if ok else ' '.join(('BLANK', c['error'])).strip()))
    if len(stats) < args.expect_canvases:
        errors.append('expected at least %d canvases, found %d' % (
            args.expect_canvases, len(stats)))
    for e in errors:
        print('error: ' + e)
    failed = bool(errors or blank)
    print('check_page: %d canvases, %d errors: %s' % (
        len(stats), len(errors), 'FAILED' if failed else 'ok'))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
