// What the client test scripts share: one line per check, exit 1 on the first failure, and
// expectError for a call that must fail with a given SDK error class and HTTP status (`detail`
// checks the API's own error fields).
export function check(cond, what) {
  if (!cond) {
    console.error(`FAIL: ${what}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

export async function expectError(promise, cls, status, what, detail = () => {}) {
  try {
    await promise;
  } catch (e) {
    check(e instanceof cls, `${what}: ${cls.name} (got ${e.constructor.name}: ${e.message})`);
    check(e.status === status, `${what}: status ${status} (got ${e.status})`);
    detail(e);
    return;
  }
  check(false, `${what}: expected an error`);
}

// Runs `modes[mode]` (default "basic") and reports; an exception is a failure.
export async function runMode(mode, modes) {
  try {
    await (modes[mode] ?? modes.basic)();
    console.log('all checks passed');
  } catch (e) {
    console.error(`FAIL: exception ${e?.constructor?.name}: ${e?.message}`);
    process.exit(1);
  }
}
