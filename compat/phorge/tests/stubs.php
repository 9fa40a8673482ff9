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
