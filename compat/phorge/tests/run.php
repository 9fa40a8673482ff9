<?php

// Tests of the gorge hand-over kit without Phorge: the predicate, the two
// guards as herald-delegation.patch adds them, the hand-over marker and the
// rollback's take-back, the key_status declaration, the configuration
// options, the /readyz probe and the setup check. The Phorge classes they
// touch are stubbed (stubs.php); the guards run as the exact lines the patch
// adds, placed where the patch's context says, and the kit's SQL runs on a
// throwaway database of the MariaDB at GORGE_TEST_MYSQL_URL (default
// mysql://root@127.0.0.1:3306), built from compat/herald-schema.sql.
//
// Usage: php compat/phorge/tests/run.php   (exit 0 only if every case passes)

error_reporting(E_ALL);
set_error_handler(function ($severity, $message, $file, $line) {
  throw new ErrorException($message, 0, $severity, $file, $line);
});

$kit = dirname(__DIR__);
// Child runs: the setup check without the patch, or with an older one.
$guards = 'current';
foreach (array('none', 'old') as $variant) {
  if (in_array("--guards={$variant}", $argv, true)) {
    $guards = $variant;
  }
}

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
  $h_queue = find_hunk($hunks, $request, 'handOver');
  $h_worker_const = find_hunk($hunks, $worker, 'GORGE_DELEGATION_GUARD');
  $h_work = find_hunk($hunks, $worker, 'handOver');
} catch (Exception $ex) {
  echo "  FAIL  herald-delegation.patch structure: {$ex->getMessage()}\n";
  echo "compat/phorge tests FAILED: the patch is not what the tests expect\n";
  exit(1);
}

// Stand-ins for the two patched classes: the added lines verbatim, with
// Phorge's surrounding behaviour reduced to what the guards interact with.
// Rows live in the test database; saves write every column, as Lisk does.
$old_const = '  const GORGE_DELEGATION_GUARD = 1;';
$request_const = array(
  'current' => code_lines($h_request_const['added']),
  'none' => '',
  'old' => $old_const,
);
$worker_const = array(
  'current' => code_lines($h_worker_const['added']),
  'none' => '',
  'old' => $old_const,
);
$request_const = $request_const[$guards];
$worker_const = $worker_const[$guards];
$key_entries = code_lines($h_key['added']);
$queue_guard = code_lines($h_queue['added']);
$work_guard = code_lines($h_work['added']);

eval(<<<PHP
final class HeraldWebhookRequest {
{$request_const}
  const STATUS_QUEUED = 'queued';
  private \$row;
  public function __construct(array \$row = array()) {
    \$this->row = \$row;
  }
  public static function load(\$id) {
    \$row = queryfx_one(null, 'SELECT * FROM %R WHERE id = %d', null, \$id);
    \$row['properties'] = json_decode(\$row['properties'], true);
    return new self(\$row);
  }
  public function getID() {
    return (int)\$this->row['id'];
  }
  public function getPHID() {
    return \$this->row['phid'];
  }
  public function getStatus() {
    return \$this->row['status'];
  }
  public function getDateModified() {
    return (int)\$this->row['dateModified'];
  }
  public function getProperties() {
    return \$this->row['properties'];
  }
  public function setProperties(array \$properties) {
    \$this->row['properties'] = \$properties;
    return \$this;
  }
  public function establishConnection(\$mode) {
    return new KitTestConnection();
  }
  // Lisk's save(): every column, dateModified = now.
  public function save(array \$changes) {
    \$this->row = \$changes + \$this->row;
    queryfx(
      null,
      'UPDATE %R SET status = %s, properties = %s, dateModified = %d
        WHERE id = %d',
      \$this,
      \$this->row['status'],
      phutil_json_encode(\$this->row['properties']),
      time(),
      \$this->getID());
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
  public \$posts = 0;
  private \$id;
  public function __construct(\$id) {
    \$this->id = \$id;
  }
  // Phorge's order: load, status check, then the guard, then the silent
  // check, then the POST.
  public function doWork() {
    \$request = HeraldWebhookRequest::load(\$this->id);
    if (\$request->getStatus() !== 'queued') {
      throw new Exception('permanent failure: not queued');
    }
{$work_guard}
    if (PhabricatorEnv::getEnvConfig('phabricator.silent')) {
      \$request->save(array(
        'status' => 'failed',
        'properties' => array('errorCode' => 'silent') +
          \$request->getProperties(),
      ));
      return;
    }
    \$this->posts++;
    \$request->save(array('status' => 'sent'));
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

if ($guards !== 'current') {
  echo "setup check with guards: {$guards} (child process)\n";
  configure(URI);
  HTTPSFuture::$answers = array(URI.'/readyz' => array(200, '{"status":"ok"}'));
  $issues = run_check();
  check("guards {$guards}: areGuardsInstalled() is false",
    !GorgeWebhookDelegation::areGuardsInstalled());
  check("guards {$guards}, service up: guards-missing says nothing is sent",
    array_keys($issues) === array('gorge.webhook.guards-missing') &&
    strpos($issues['gorge.webhook.guards-missing']->text(),
      'so it sends none of them') !== false,
    implode(',', array_keys($issues)));
  HTTPSFuture::$answers = array();
  $issues = run_check();
  check("guards {$guards}, service down: guards-missing names the failure",
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
check('doWork guard comes right after the status check, before silent',
  preg_match('/\$status\)\);\n    }\n$/', $before_work) &&
  trim($h_work['after'][0]) ===
    '// If we\'re in silent mode, permanently fail the webhook request and then',
  $before_work);
check('queueCall guard returns $this (callers chain on it)',
  strpos($queue_guard, 'return $this;') !== false);
check('both guards ask handOver() and nothing else',
  preg_match_all('/GorgeWebhook\w+::\w+/', $queue_guard.$work_guard, $m) &&
  array_unique($m[0]) === array('GorgeWebhookDelegation::handOver'));
check('the patch only adds lines and touches two files',
  count(array_unique(array_map(function ($h) {
    return $h['file'];
  }, $hunks))) === 2 && count($hunks) === 5);
check('the patch declares the guard version the classes expect',
  strpos(code_lines($h_request_const['added']),
    'GORGE_DELEGATION_GUARD = '.GorgeWebhookDelegation::GUARD_VERSION.';')
    !== false &&
  code_lines($h_request_const['added']) ===
    code_lines($h_worker_const['added']));

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

KitTestDatabase::create();
register_shutdown_function(array('KitTestDatabase', 'drop'));

// Inserts a request as Lisk does (dateCreated = dateModified) and returns
// its id. $columns overrides status, properties (an array) and the epochs.
function insert_request(array $columns = array()) {
  static $serial = 0;
  $serial++;
  $now = time();
  $columns += array(
    'status' => 'queued',
    'properties' => array('retry' => 'forever', 'test' => false),
    'lastRequestEpoch' => 0,
    'dateCreated' => $now,
    'dateModified' => $now,
  );
  queryfx(
    null,
    'INSERT INTO %R (phid, webhookPHID, objectPHID, status, properties,
      lastRequestResult, lastRequestEpoch, dateCreated, dateModified)
      VALUES (%s, %s, %s, %s, %s, %s, %d, %d, %d)',
    null,
    "PHID-HWBR-kit{$serial}",
    'PHID-HWBH-kit',
    'PHID-TASK-kit',
    $columns['status'],
    phutil_json_encode($columns['properties']),
    'none',
    $columns['lastRequestEpoch'],
    $columns['dateCreated'],
    $columns['dateModified']);
  return KitTestDatabase::$mysqli->insert_id;
}

function stored($id) {
  return queryfx_one(
    null,
    'SELECT status, properties, dateCreated, dateModified, lastRequestEpoch,
      properties LIKE %~ AS marked FROM %R WHERE id = %d',
    GorgeWebhookDelegation::getMarkerText(),
    null,
    $id);
}

$marked_props = array(
  'retry' => 'forever',
  'test' => false,
  'handedOverTo' => 'gorge-webhook',
);

echo "hand-over marker\n";
check('the marker is "handedOverTo":"gorge-webhook" as json_encode writes it',
  GorgeWebhookDelegation::getMarkerText() ===
    '"handedOverTo":"gorge-webhook"');
// gorge-webhook's condition (crates/gorge-claim/src/handover.rs), verbatim.
$gorge_condition =
  'properties LIKE \'%"handedOverTo":"gorge-webhook"%\'';

echo "queueCall guard\n";
configure(URI);
$id = insert_request();
$before = stored($id);
$req = HeraldWebhookRequest::load($id);
$ret = $req->queueCall();
$after = stored($id);
$gorge_sees = queryfx_one(null,
  "SELECT {$gorge_condition} AS yes FROM %R WHERE id = %d", null, $id);
check('delegated: no task, returns the request, row marked last',
  PhabricatorWorker::$scheduled === array() && $ret === $req &&
  $after['properties'] ===
    '{"retry":"forever","test":false,"handedOverTo":"gorge-webhook"}',
  $after['properties']);
check('delegated: gorge-webhook\'s own condition matches the marked row',
  $gorge_sees['yes'] === '1');
check('delegated: only properties changed (a fresh row stays fresh)',
  array_diff_assoc($after, $before) ===
    array('properties' => $after['properties'], 'marked' => '1'),
  json_encode(array($before, $after)));
check('delegated: the object knows it is handed over',
  GorgeWebhookDelegation::isHandedOver($req));

configure(null);
$id = insert_request();
HeraldWebhookRequest::load($id)->queueCall();
check('not delegated: exactly one HeraldWebhookWorker task, as stock',
  PhabricatorWorker::$scheduled === array(array(
    'HeraldWebhookWorker',
    array('webhookRequestPHID' => 'PHID-HWBR-kit'.$id),
    array('objectPHID' => 'PHID-HWBR-kit'.$id),
  )) && stored($id)['marked'] === '0',
  json_encode(PhabricatorWorker::$scheduled));

configure(URI, true);
$id = insert_request();
HeraldWebhookRequest::load($id)->queueCall();
check('URI set but silent: task scheduled, nothing handed over',
  count(PhabricatorWorker::$scheduled) === 1 && stored($id)['marked'] === '0');

configure(URI);
$id = insert_request();
$stale = HeraldWebhookRequest::load($id);
queryfx(null, 'UPDATE %R SET dateModified = dateModified + 1 WHERE id = %d',
  null, $id);
$stale->queueCall();
check('row changed since it was read: not marked, a task instead (Phorge\'s)',
  count(PhabricatorWorker::$scheduled) === 1 && stored($id)['marked'] === '0');

configure(null);
$id = insert_request(array('properties' => $marked_props));
HeraldWebhookRequest::load($id)->queueCall();
check('a handed-over row never gets a task, even with the switch off',
  PhabricatorWorker::$scheduled === array());

echo "doWork guard\n";
configure(URI);
$id = insert_request(array(
  'lastRequestEpoch' => time() - 100,
  'dateModified' => time() - 100,
));
$before = stored($id);
$task = new HeraldWebhookWorker($id);
$task->doWork();
$after = stored($id);
check('delegated: a task from before the switch hands its row over, no POST',
  $task->posts === 0 && $after['status'] === 'queued' &&
  $after['marked'] === '1' &&
  $after['dateModified'] === $before['dateModified'] &&
  $after['lastRequestEpoch'] === $before['lastRequestEpoch']);

configure(null);
$task = new HeraldWebhookWorker(insert_request());
$task->doWork();
check('not delegated: Phorge delivers its own row', $task->posts === 1);

configure(null);
$id = insert_request(array('properties' => $marked_props));
$before = stored($id);
$task = new HeraldWebhookWorker($id);
$task->doWork();
check('not delegated, row handed over: Phorge never sends it, row untouched',
  $task->posts === 0 && stored($id) === $before);

configure(URI, true);
$id = insert_request(array('properties' => $marked_props));
$before = stored($id);
$task = new HeraldWebhookWorker($id);
$task->doWork();
check('silent, row handed over: left to gorge-webhook, not failed by Phorge',
  $task->posts === 0 && stored($id) === $before);

configure(URI, true);
$id = insert_request();
$task = new HeraldWebhookWorker($id);
$task->doWork();
$after = stored($id);
check('silent, Phorge\'s own row: silent wins (failed/silent, no POST)',
  $task->posts === 0 && $after['status'] === 'failed' &&
  json_decode($after['properties'], true)['errorCode'] === 'silent');

echo "take-back (rollback)\n";
configure(null);
$now = time();
$id = insert_request(array('properties' => $marked_props));
$before = stored($id);
$req = HeraldWebhookRequest::load($id);
$result = GorgeWebhookDelegation::takeBack($req, $now);
$after = stored($id);
check('a fresh handed-over row is taken back: marker gone, nothing else',
  $result === 'taken' && $after['marked'] === '0' &&
  $after['properties'] === '{"retry":"forever","test":false}' &&
  $after['dateModified'] === $before['dateModified'] &&
  !GorgeWebhookDelegation::isHandedOver($req));
$req->queueCall();
check('... and then gets a task', count(PhabricatorWorker::$scheduled) === 1);

// Claimed by gorge-webhook: dateModified moved ahead of the last result.
$claimed = array(
  'properties' => $marked_props,
  'dateCreated' => $now - 20,
  'dateModified' => $now - 10,
);
$id = insert_request($claimed);
$before = stored($id);
check('a row gorge-webhook claimed 10 s ago is left alone (in flight)',
  GorgeWebhookDelegation::takeBack(HeraldWebhookRequest::load($id), $now) ===
    'in-flight' && stored($id) === $before);
$window = GorgeWebhookDelegation::IN_FLIGHT_WINDOW;
$id = insert_request(array(
  'dateCreated' => $now - $window - 20,
  'dateModified' => $now - $window - 1,
) + $claimed);
check('a claim older than the in-flight window is taken back',
  GorgeWebhookDelegation::takeBack(HeraldWebhookRequest::load($id), $now) ===
    'taken');
$id = insert_request(array(
  'properties' => $marked_props,
  'lastRequestEpoch' => $now - 5,
  'dateModified' => $now - 5,
));
check('a row whose last attempt gorge-webhook wrote back is taken back',
  GorgeWebhookDelegation::takeBack(HeraldWebhookRequest::load($id), $now) ===
    'taken');
$id = insert_request(array('properties' => $marked_props));
$read = HeraldWebhookRequest::load($id);
queryfx(null, 'UPDATE %R SET status = %s WHERE id = %d', null, 'sent', $id);
$before = stored($id);
check('a row gorge-webhook finished meanwhile is not touched',
  GorgeWebhookDelegation::takeBack($read, $now) === 'changed' &&
  stored($id) === $before);
$id = insert_request();
check('a row that was never handed over is not Phorge\'s to take back',
  GorgeWebhookDelegation::takeBack(HeraldWebhookRequest::load($id), $now) ===
    'changed');

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
check('silent, service reachable (even not ready): silent issue',
  array_keys($issues) === array('gorge.webhook.silent') &&
  strpos($issues['gorge.webhook.silent']->text(),
    'still sends the requests that were handed over') !== false);

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

foreach (array('none' => 'without the patch', 'old' => 'with an older patch')
    as $variant => $label) {
  echo "setup check {$label}\n";
  $cmd = escapeshellarg(PHP_BINARY).' '.escapeshellarg(__FILE__).
    " --guards={$variant} 2>&1";
  $child_output = array();
  exec($cmd, $child_output, $child_rc);
  echo implode("\n", $child_output)."\n";
  check("child run {$label} passed", $child_rc === 0,
    "exit code {$child_rc}");
}

$total = $passes + count($failures);
if ($failures) {
  echo "compat/phorge tests FAILED: ".count($failures)." of {$total}: ".
    implode('; ', $failures)."\n";
  exit(1);
}
echo "compat/phorge tests: all {$total} cases ok\n";
