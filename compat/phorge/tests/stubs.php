<?php

// Minimal stand-ins for the Phorge and Arcanist symbols the kit touches, so
// that its classes and the guards from herald-delegation.patch run without a
// Phorge checkout. Each stub keeps only the behaviour the kit relies on.

function pht($format, ...$args) {
  return $args ? vsprintf($format, $args) : $format;
}

function id($value) {
  return $value;
}

function idx(array $map, $key, $default = null) {
  return array_key_exists($key, $map) ? $map[$key] : $default;
}

function phutil_nonempty_string($value) {
  return is_string($value) && $value !== '';
}

class Phobject {}

final class PhabricatorEnv {
  public static $config = array();

  public static function getEnvConfig($key) {
    if (!array_key_exists($key, self::$config)) {
      throw new Exception("Stub config has no key '{$key}'.");
    }
    return self::$config[$key];
  }

  public static function reset(array $config) {
    self::$config = $config + array(
      'gorge.webhook.uri' => null,
      'gorge.webhook.token' => null,
      'phabricator.silent' => false,
    );
  }
}

final class PhabricatorWorker {
  public static $scheduled = array();

  public static function scheduleTask($class, $data, $options = array()) {
    self::$scheduled[] = array($class, $data, $options);
  }
}

class PhabricatorConfigValidationException extends Exception {}

final class PhabricatorConfigOption {
  private $props = array();

  public function __call($method, array $args) {
    if (strncmp($method, 'set', 3) === 0) {
      $this->props[lcfirst(substr($method, 3))] = $args[0];
      return $this;
    }
    if (strncmp($method, 'add', 3) === 0) {
      $this->props[lcfirst(substr($method, 3)).'s'][] = $args;
      return $this;
    }
    if (strncmp($method, 'get', 3) === 0) {
      return idx($this->props, lcfirst(substr($method, 3)));
    }
    throw new Exception("Stub option has no method {$method}().");
  }
}

abstract class PhabricatorApplicationConfigOptions extends Phobject {
  final protected function newOption($key, $type, $default) {
    return id(new PhabricatorConfigOption())
      ->setKey($key)
      ->setType($type)
      ->setDefault($default)
      ->setGroup($this);
  }

  final protected function deformat($string) {
    return preg_replace('/(?<=\S)\n(?=\S)/', ' ', $string);
  }

  // Phorge's validateOption() skips the default and null, then calls this.
  public function validateOption(PhabricatorConfigOption $option, $value) {
    if ($value === $option->getDefault() || $value === null) {
      return;
    }
    $this->didValidateOption($option, $value);
  }

  protected function didValidateOption(
    PhabricatorConfigOption $option,
    $value) {}
}

final class PhutilURI {
  private $parts;

  public function __construct($uri) {
    $parts = parse_url($uri);
    $this->parts = is_array($parts) ? $parts : array();
  }

  public function getProtocol() {
    return idx($this->parts, 'scheme', '');
  }

  public function getDomain() {
    return idx($this->parts, 'host', '');
  }
}

final class PhabricatorSetupIssue {
  public $key;
  public $props = array();

  public function __construct($key) {
    $this->key = $key;
  }

  public function __call($method, array $args) {
    $this->props[$method][] = $args[0];
    return $this;
  }

  public function text() {
    $parts = array();
    foreach (array('setName', 'setSummary', 'setMessage') as $m) {
      $parts[] = implode(' ', idx($this->props, $m, array()));
    }
    return implode("\n", $parts);
  }
}

abstract class PhabricatorSetupCheck extends Phobject {
  const GROUP_IMPORTANT = 'important';

  private $issues = array();

  abstract protected function executeChecks();

  final protected function newIssue($key) {
    return $this->issues[$key] = new PhabricatorSetupIssue($key);
  }

  final public function getIssues() {
    return $this->issues;
  }

  final public function runSetupChecks() {
    $this->issues = array();
    $this->executeChecks();
  }
}

abstract class HTTPFutureResponseStatus extends Exception {
  private $statusCode;

  public function __construct($code, $message) {
    $this->statusCode = $code;
    parent::__construct($message);
  }

  public function getStatusCode() {
    return $this->statusCode;
  }
}

final class HTTPFutureHTTPResponseStatus extends HTTPFutureResponseStatus {}

final class HTTPFutureCURLResponseStatus extends HTTPFutureResponseStatus {}

// Answers from a table keyed by URI: array(code, body) for an HTTP answer,
// or a string for a transport error. Unknown URIs fail like a refused
// connection. Every request is logged.
final class HTTPSFuture {
  public static $answers = array();
  public static $log = array();

  private $uri;
  private $request = array();

  public function __construct($uri) {
    $this->uri = $uri;
    $this->request = array('uri' => $uri, 'headers' => array());
  }

  public function setMethod($method) {
    $this->request['method'] = $method;
    return $this;
  }

  public function setTimeout($timeout) {
    $this->request['timeout'] = $timeout;
    return $this;
  }

  public function addHeader($name, $value) {
    $this->request['headers'][$name] = $value;
    return $this;
  }

  public function resolve() {
    self::$log[] = $this->request;
    $answer = idx(self::$answers, $this->uri, '[cURL/7] Connection refused');
    if (is_string($answer)) {
      return array(new HTTPFutureCURLResponseStatus(7, $answer), '', array());
    }
    list($code, $body) = $answer;
    return array(
      new HTTPFutureHTTPResponseStatus($code, "[HTTP/{$code}]"),
      $body,
      array(),
    );
  }
}

function phutil_json_encode($value) {
  $result = json_encode($value);
  if ($result === false) {
    throw new Exception('Failed to JSON encode value.');
  }
  return $result;
}

// The kit's SQL runs for real: against a throwaway `{namespace}_herald` built
// from compat/herald-schema.sql on the server of GORGE_TEST_MYSQL_URL (the
// Rust tests' variable; default mysql://root@127.0.0.1:3306). queryfx() and
// queryfx_one() format with the conversions the kit uses (%R is always
// herald_webhookrequest) and run on that database.
final class KitTestDatabase {
  public static $mysqli;
  public static $database;

  public static function create() {
    $url = getenv('GORGE_TEST_MYSQL_URL');
    if (!is_string($url) || $url === '') {
      $url = 'mysql://root@127.0.0.1:3306';
    }
    $parts = parse_url($url);
    mysqli_report(MYSQLI_REPORT_ERROR | MYSQLI_REPORT_STRICT);
    self::$mysqli = new mysqli(
      idx($parts, 'host', '127.0.0.1'),
      urldecode(idx($parts, 'user', 'root')),
      urldecode(idx($parts, 'pass', '')),
      '',
      idx($parts, 'port', 3306));
    $namespace = 'gk'.bin2hex(random_bytes(6));
    $schema = str_replace(
      '{$NAMESPACE}',
      $namespace,
      file_get_contents(dirname(__DIR__, 2).'/herald-schema.sql'));
    $schema = preg_replace('/^\s*--.*$/m', '', $schema);
    foreach (explode(';', $schema) as $statement) {
      if (trim($statement) !== '') {
        self::$mysqli->query($statement);
      }
    }
    self::$database = $namespace.'_herald';
    self::$mysqli->select_db(self::$database);
  }

  public static function drop() {
    if (self::$database !== null) {
      self::$mysqli->query('DROP DATABASE `'.self::$database.'`');
      self::$database = null;
    }
  }
}

final class KitTestConnection {
  public function getAffectedRows() {
    return KitTestDatabase::$mysqli->affected_rows;
  }
}

function kit_test_qsprintf($pattern, array $args) {
  $db = KitTestDatabase::$mysqli;
  return preg_replace_callback(
    '/%([Rds~])/',
    function ($match) use (&$args, $db) {
      $arg = array_shift($args);
      switch ($match[1]) {
        case 'R':
          return '`herald_webhookrequest`';
        case 'd':
          return (string)(int)$arg;
        case 's':
          return "'".$db->real_escape_string($arg)."'";
        case '~':
          return "'%".$db->real_escape_string(addcslashes($arg, '\\%_'))."%'";
      }
    },
    $pattern);
}

function queryfx($conn, $pattern, ...$args) {
  KitTestDatabase::$mysqli->query(kit_test_qsprintf($pattern, $args));
}

function queryfx_one($conn, $pattern, ...$args) {
  $result = KitTestDatabase::$mysqli->query(kit_test_qsprintf($pattern, $args));
  $row = $result->fetch_assoc();
  return $row === null ? null : $row;
}
