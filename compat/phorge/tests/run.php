<?php

// Tests of the gorge hand-over kit without Phorge: the predicate, the two
// guards as herald-delegation.patch adds them, the key_status declaration,
// the configuration options, the /readyz probe and the setup check. The
// Phorge classes they touch are stubbed (stubs.php); the guards run as the
// exact lines the patch adds, placed where the patch's context says.
//
// Usage: php compat/phorge/tests/run.php   (exit 0 only if every case passes)

error_reporting(E_ALL);
set_error_handler(function ($severity, $message, $file, $line) {
  throw new ErrorException($message, 0, $severity, $file, $line);
});

$kit = dirname(__DIR__);
$without_guards = in_array('--without-guards', $argv, true);

require_once __DIR__.'/stubs.php';
foreach (glob($kit.'/src/extensions/gorge/*.php') as $file) {
  require_once $file;
}

$failures = array();
$passes = 0;

function check($name, $ok, $detail = '') {
  global $failures, $passes;
  if ($ok) {
    $passes++;
    echo "  ok    {$name}\n";
  } else {
    $failures[] = $name;
    echo "  FAIL  {$name}".($detail !== '' ? ": {$detail}" : '')."\n";
  }
}

/**
 * Splits the patch into hunks: file, context before the added lines, the
 * added lines, context after them. Each hunk of this patch adds one block.
 */
function read_hunks($path) {
  $hunks = array();
  $file = null;
  $current = null;
  foreach (explode("\n", file_get_contents($path)) as $line) {
    if (strncmp($line, '+++ b/', 6) === 0) {
      $file = basename(substr($line, 6));
      continue;
    }
    if (strncmp($line, '--- ', 4) === 0 || strncmp($line, 'diff ', 5) === 0 ||
        strncmp($line, 'index ', 6) === 0) {
      continue;
    }
    if (strncmp($line, '@@', 2) === 0) {
      if ($current) {
        $hunks[] = $current;
      }
      $current = array(
        'file' => $file,
        'before' => array(),
        'added' => array(),
        'after' => array(),
      );
      continue;
    }
    if ($current === null) {
      continue;
    }
    $kind = substr($line, 0, 1);
    $text = (string)substr($line, 1);
    if ($kind === '+') {
      if ($current['after']) {
        throw new Exception("Hunk in {$file} adds two separate blocks.");
      }
      $current['added'][] = $text;
    } else if ($kind === ' ' || $line === '') {
      $current[$current['added'] ? 'after' : 'before'][] = $text;
    } else if ($kind === '-') {
      throw new Exception("The patch must only add lines ({$file}).");
    }
  }
  if ($current) {
    $hunks[] = $current;
  }
  return $hunks;
}

function find_hunk(array $hunks, $file, $needle) {
  $found = array();
  foreach ($hunks as $hunk) {
    if ($hunk['file'] === $file &&
        strpos(implode("\n", $hunk['added']), $needle) !== false) {
      $found[] = $hunk;
    }
  }
  if (count($found) !== 1) {
    throw new Exception(
      count($found)." hunks in {$file} add '{$needle}', expected 1.");
  }
  return $found[0];
}

function code_lines(array $lines) {
  return implode("\n", $lines);
}

$request = 'HeraldWebhookRequest.php';
$worker = 'HeraldWebhookWorker.php';
try {
  $hunks = read_hunks($kit.'/herald-delegation.patch');
  $h_request_const = find_hunk($hunks, $request, 'GORGE_DELEGATION_GUARD');
  $h_key = find_hunk($hunks, $request, 'key_status');
  $h_queue = find_hunk($hunks, $request, 'isDeliveryDelegated');
  $h_worker_const = find_hunk($hunks, $worker, 'GORGE_DELEGATION_GUARD');
  $h_work = find_hunk($hunks, $worker, 'isDeliveryDelegated');
} catch (Exception $ex) {
  echo "  FAIL  herald-delegation.patch structure: {$ex->getMessage()}\n";
  echo "compat/phorge tests FAILED: the patch is not what the tests expect\n";
  exit(1);
}

// Stand-ins for the two patched classes: the added lines verbatim, with
// Phorge's surrounding behaviour reduced to what the guards interact with.
$request_const = $without_guards ? '' : code_lines($h_request_const['added']);
$worker_const = $without_guards ? '' : code_lines($h_worker_const['added']);
$key_entries = code_lines($h_key['added']);
$queue_guard = code_lines($h_queue['added']);
$work_guard = code_lines($h_work['added']);

eval(<<<PHP
final class HeraldWebhookRequest {
{$request_const}
  public function getPHID() {
    return 'PHID-HWBR-test';
  }
  public function getKeySchema() {
    return array(
{$key_entries}
    );
  }
  public function queueCall() {
{$queue_guard}
    PhabricatorWorker::scheduleTask(
      'HeraldWebhookWorker',
      array('webhookRequestPHID' => \$this->getPHID()),
      array('objectPHID' => \$this->getPHID()));
    return \$this;
  }
}

final class HeraldWebhookWorker {
{$worker_const}
  public \$row;
  public \$posts = 0;
  public function __construct(array \$row) {
    \$this->row = \$row;
  }
  // Phorge's order: load, status check, silent check, then the guard.
  public function doWork() {
    if (\$this->row['status'] !== 'queued') {
      throw new Exception('permanent failure: not queued');
    }
    if (PhabricatorEnv::getEnvConfig('phabricator.silent')) {
      \$this->row = array('status' => 'failed', 'errorCode' => 'silent');
      return;
    }
{$work_guard}
    \$this->posts++;
    \$this->row = array('status' => 'sent');
  }
}
PHP
);

function configure($uri, $silent = false, $token = null) {
  PhabricatorEnv::reset(array(
    'gorge.webhook.uri' => $uri,
    'gorge.webhook.token' => $token,
    'phabricator.silent' => $silent,
  ));
  PhabricatorWorker::$scheduled = array();
  HTTPSFuture::$log = array();
}

function run_check() {
  $check = new GorgeWebhookSetupCheck();
  $check->runSetupChecks();
  return $check->getIssues();
}

const URI = 'http://gorge-webhook:8160';

if ($without_guards) {
  echo "setup check without the patch (child process)\n";
  configure(URI);
  HTTPSFuture::$answers = array(URI.'/readyz' => array(200, '{"status":"ok"}'));
  $issues = run_check();
  check('guards absent: areGuardsInstalled() is false',
    !GorgeWebhookDelegation::areGuardsInstalled());
  check('guards absent, service up: one guards-missing issue saying twice',
    array_keys($issues) === array('gorge.webhook.guards-missing') &&
    strpos($issues['gorge.webhook.guards-missing']->text(), 'BOTH deliver')
      !== false,
    implode(',', array_keys($issues)));
  HTTPSFuture::$answers = array();
  $issues = run_check();
  check('guards absent, service down: guards-missing names the failure',
    array_keys($issues) === array('gorge.webhook.guards-missing') &&
    strpos($issues['gorge.webhook.guards-missing']->text(),
      'Connection refused') !== false);
  exit($failures ? 1 : 0);
}

echo "patch placement\n";
check('queueCall guard is the first statement of queueCall()',
  end($h_queue['before']) === '  public function queueCall() {' &&
  trim($h_queue['after'][0]) === 'PhabricatorWorker::scheduleTask(');
$before_work = implode("\n", $h_work['before']);
check('doWork guard comes right after the silent check',
  strpos($before_work, 'HeraldWebhookRequest::ERROR_SILENT);') !== false &&
  preg_match('/ERROR_SILENT\);\n\s+return;\n\s+}\n$/', $before_work."\n") &&
  trim($h_work['after'][0]) === '$hook = $request->getWebhook();',
  $before_work);
check('queueCall guard returns $this (callers chain on it)',
  strpos($queue_guard, 'return $this;') !== false);
check('the patch only adds lines and touches two files',
  count(array_unique(array_map(function ($h) {
    return $h['file'];
  }, $hunks))) === 2 && count($hunks) === 5);

echo "key_status\n";
$keys = (new HeraldWebhookRequest())->getKeySchema();
check('key_status declared as (status, id)',
  idx($keys, 'key_status') === array('columns' => array('status', 'id')),
  json_encode($keys));

echo "predicate\n";
$cases = array(
  array(null, false, false, 'unset'),
  array('', false, false, 'empty'),
  array("  \n", false, false, 'blank'),
  array(URI, false, true, 'set, silent off'),
  array(URI, true, false, 'set, silent on'),
  array(null, true, false, 'unset, silent on'),
);
foreach ($cases as $case) {
  list($uri, $silent, $expect, $label) = $case;
  configure($uri, $silent);
  check("isDeliveryDelegated() {$label} -> ".json_encode($expect),
    GorgeWebhookDelegation::isDeliveryDelegated() === $expect);
}
configure(URI.'/ ');
check('getServiceURI() trims blanks and the trailing slash',
  GorgeWebhookDelegation::getServiceURI() === URI);
configure(URI, false, '');
check('empty token is no token',
  GorgeWebhookDelegation::getServiceToken() === null);
check('areGuardsInstalled() with the patch',
  GorgeWebhookDelegation::areGuardsInstalled());

echo "queueCall guard\n";
configure(URI);
$req = new HeraldWebhookRequest();
$ret = $req->queueCall();
check('delegated: no task scheduled, returns the request',
  PhabricatorWorker::$scheduled === array() && $ret === $req);
configure(null);
(new HeraldWebhookRequest())->queueCall();
check('not delegated: exactly one HeraldWebhookWorker task, as stock',
  PhabricatorWorker::$scheduled === array(array(
    'HeraldWebhookWorker',
    array('webhookRequestPHID' => 'PHID-HWBR-test'),
    array('objectPHID' => 'PHID-HWBR-test'),
  )),
  json_encode(PhabricatorWorker::$scheduled));
configure(URI, true);
(new HeraldWebhookRequest())->queueCall();
check('URI set but silent: task still scheduled (Phorge marks it silent)',
  count(PhabricatorWorker::$scheduled) === 1);

echo "doWork guard\n";
configure(URI);
$task = new HeraldWebhookWorker(array('status' => 'queued'));
$task->doWork();
check('delegated: old task exits, no POST, row untouched',
  $task->posts === 0 && $task->row === array('status' => 'queued'));
configure(null);
$task = new HeraldWebhookWorker(array('status' => 'queued'));
$task->doWork();
check('not delegated: Phorge delivers', $task->posts === 1);
configure(URI, true);
$task = new HeraldWebhookWorker(array('status' => 'queued'));
$task->doWork();
check('URI set but silent: silent wins (failed/silent, no POST)',
  $task->posts === 0 &&
  $task->row === array('status' => 'failed', 'errorCode' => 'silent'));

echo "configuration options\n";
$group = new GorgeWebhookConfigOptions();
$options = array();
foreach ($group->getOptions() as $option) {
  $options[$option->getKey()] = $option;
}
check('defines gorge.webhook.uri and gorge.webhook.token',
  array_keys($options) === array('gorge.webhook.uri', 'gorge.webhook.token'));
check('both default to null (delegation off)',
  $options['gorge.webhook.uri']->getDefault() === null &&
  $options['gorge.webhook.token']->getDefault() === null);
check('token is hidden (a secret)',
  $options['gorge.webhook.token']->getHidden() === true);
check('uri description says Phorge stops its own delivery',
  strpos($options['gorge.webhook.uri']->getDescription(),
    'stops scheduling `HeraldWebhookWorker`') !== false);
$valid = array('http://gorge-webhook:8160', 'https://gorge.example.com/');
$invalid = array('gorge-webhook:8160', 'ftp://gorge', 'http://');
foreach ($valid as $value) {
  try {
    $group->validateOption($options['gorge.webhook.uri'], $value);
    check("accepts {$value}", true);
  } catch (PhabricatorConfigValidationException $ex) {
    check("accepts {$value}", false, $ex->getMessage());
  }
}
foreach ($invalid as $value) {
  try {
    $group->validateOption($options['gorge.webhook.uri'], $value);
    check("rejects {$value}", false);
  } catch (PhabricatorConfigValidationException $ex) {
    check("rejects {$value}",
      strpos($ex->getMessage(), 'gorge.webhook.uri') !== false);
  }
}

echo "readiness probe\n";
$r = GorgeWebhookServiceProbe::interpretReadiness(
  'u', 503, '{"status":"unavailable","reason":"Unknown database \'x\'"}', null);
check('503 with reason: reachable, not ready, reason quoted',
  $r['reachable'] && !$r['ready'] &&
  strpos($r['reason'], "Unknown database 'x'") !== false, $r['reason']);
$r = GorgeWebhookServiceProbe::interpretReadiness(
  'u', 503, '{"status":"draining"}', null);
check('503 draining: says shutting down',
  !$r['ready'] && strpos($r['reason'], 'shutting down') !== false);
$r = GorgeWebhookServiceProbe::interpretReadiness('u', 200, '<html>', null);
check('200 that is not gorge: not ready',
  $r['reachable'] && !$r['ready']);
$r = GorgeWebhookServiceProbe::interpretReadiness('u', null, null, 'refused');
check('no answer: unreachable with the transport error',
  !$r['reachable'] && strpos($r['reason'], 'refused') !== false);

echo "setup check\n";
configure(null);
$issues = run_check();
check('URI unset: no issue and no request',
  $issues === array() && HTTPSFuture::$log === array());

configure(URI.'/');
HTTPSFuture::$answers = array(URI.'/readyz' => array(200, '{"status":"ok"}'));
$issues = run_check();
check('delegated and ready: no issue', $issues === array());
check('probes <uri>/readyz once, GET, 3 s, no token',
  count(HTTPSFuture::$log) === 1 &&
  HTTPSFuture::$log[0]['uri'] === URI.'/readyz' &&
  HTTPSFuture::$log[0]['method'] === 'GET' &&
  HTTPSFuture::$log[0]['timeout'] === 3 &&
  HTTPSFuture::$log[0]['headers'] === array(),
  json_encode(HTTPSFuture::$log));

configure(URI);
HTTPSFuture::$answers = array(URI.'/readyz' => array(503,
  '{"status":"unavailable","reason":"Access denied for user \'gorge\'"}'));
$issues = run_check();
check('delegated, 503: not-ready issue with the service\'s reason',
  array_keys($issues) === array('gorge.webhook.not-ready') &&
  strpos($issues['gorge.webhook.not-ready']->text(),
    "Access denied for user 'gorge'") !== false);

configure(URI);
HTTPSFuture::$answers = array();
$issues = run_check();
check('delegated, unreachable: not-ready issue naming the failure',
  array_keys($issues) === array('gorge.webhook.not-ready') &&
  strpos($issues['gorge.webhook.not-ready']->text(), 'Connection refused')
    !== false);

configure(URI, true);
HTTPSFuture::$answers = array(URI.'/readyz' => array(503,
  '{"status":"unavailable","reason":"x"}'));
$issues = run_check();
check('silent, service reachable (even not ready): loud silent issue',
  array_keys($issues) === array('gorge.webhook.silent') &&
  strpos($issues['gorge.webhook.silent']->text(), 'Both sides deliver')
    !== false);

configure(URI, true);
HTTPSFuture::$answers = array();
check('silent, service down: no issue', run_check() === array());

configure(URI, false, 'sekrit');
HTTPSFuture::$answers = array(
  URI.'/readyz' => array(200, '{"status":"ok"}'),
  URI.'/api/webhook/stats' => array(401, '{"error":{}}'),
);
$issues = run_check();
check('token refused: stats issue naming gorge.webhook.token',
  array_keys($issues) === array('gorge.webhook.stats') &&
  strpos($issues['gorge.webhook.stats']->text(), 'gorge.webhook.token')
    !== false);
check('token sent as X-Service-Token to stats only',
  HTTPSFuture::$log[0]['headers'] === array() &&
  HTTPSFuture::$log[1]['headers'] === array('X-Service-Token' => 'sekrit'));

configure(URI, false, 'sekrit');
HTTPSFuture::$answers = array(
  URI.'/readyz' => array(200, '{"status":"ok"}'),
  URI.'/api/webhook/stats' => array(200,
    '{"data":{"queuedCount":3,"sentCount":1,"failedCount":0,'.
    '"activeWebhooks":1}}'),
);
check('token accepted: no issue', run_check() === array());

echo "setup check without the patch\n";
$cmd = escapeshellarg(PHP_BINARY).' '.escapeshellarg(__FILE__).
  ' --without-guards 2>&1';
exec($cmd, $child_output, $child_rc);
echo implode("\n", $child_output)."\n";
check('child run without the patch passed', $child_rc === 0,
  "exit code {$child_rc}");

$total = $passes + count($failures);
if ($failures) {
  echo "compat/phorge tests FAILED: ".count($failures)." of {$total}: ".
    implode('; ', $failures)."\n";
  exit(1);
}
echo "compat/phorge tests: all {$total} cases ok\n";
