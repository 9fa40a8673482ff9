<?php

/**
 * Asks a running gorge-webhook whether it is ready (GET /readyz) and how
 * many requests it sees queued (GET /api/webhook/stats). Used by
 * GorgeWebhookSetupCheck; never blocks delivery and never waits longer than
 * the timeout.
 */
final class GorgeWebhookServiceProbe extends Phobject {

  const TIMEOUT_SECONDS = 3;

  private $baseURI;
  private $token;

  public function __construct($base_uri, $token = null) {
    $this->baseURI = rtrim($base_uri, '/');
    $this->token = $token;
  }

  /**
   * @return dict<string, wild> "reachable" (an HTTP answer came back),
   *   "ready" (200 with status "ok") and "reason" (why not, for humans).
   */
  public function probeReadiness() {
    $uri = $this->baseURI.'/readyz';
    list($code, $body, $error) = $this->get($uri, false);
    return self::interpretReadiness($uri, $code, $body, $error);
  }

  /**
   * @return dict<string, wild> "queued" (int or null) and "reason" (null
   *   when the count was read).
   */
  public function fetchQueueCounts() {
    $uri = $this->baseURI.'/api/webhook/stats';
    list($code, $body, $error) = $this->get($uri, true);
    return self::interpretStats($uri, $code, $body, $error);
  }

  public static function interpretReadiness($uri, $code, $body, $error) {
    if ($code === null) {
      return array(
        'reachable' => false,
        'ready' => false,
        'reason' => pht('No answer from %s: %s', $uri, $error),
      );
    }

    $decoded = self::decodeObject($body);
    $status = idx($decoded, 'status');
    $detail = idx($decoded, 'reason');

    if ($code === 200 && $status === 'ok') {
      return array(
        'reachable' => true,
        'ready' => true,
        'reason' => null,
      );
    }

    if ($status === 'draining') {
      $reason = pht(
        '%s answered HTTP %d "draining": the service is shutting down.',
        $uri,
        $code);
    } else if (is_string($detail) && $detail !== '') {
      $reason = pht('%s answered HTTP %d: %s', $uri, $code, $detail);
    } else if ($code === 200) {
      $reason = pht(
        '%s answered HTTP 200 but not {"status":"ok"}; is this address '.
        'really gorge-webhook\'s status port?',
        $uri);
    } else {
      $reason = pht('%s answered HTTP %d.', $uri, $code);
    }

    return array(
      'reachable' => true,
      'ready' => false,
      'reason' => $reason,
    );
  }

  public static function interpretStats($uri, $code, $body, $error) {
    if ($code === null) {
      return array(
        'queued' => null,
        'reason' => pht('No answer from %s: %s', $uri, $error),
      );
    }

    if ($code === 401) {
      return array(
        'queued' => null,
        'reason' => pht(
          '%s refused the token (HTTP 401): set "%s" to the service\'s '.
          'GORGE_SERVICE_TOKEN.',
          $uri,
          GorgeWebhookDelegation::TOKEN_KEY),
      );
    }

    $decoded = self::decodeObject($body);
    $data = idx($decoded, 'data');
    $queued = is_array($data) ? idx($data, 'queuedCount') : null;
    if ($code !== 200 || !is_int($queued)) {
      return array(
        'queued' => null,
        'reason' => pht('%s answered HTTP %d without a queue count.',
          $uri,
          $code),
      );
    }

    return array(
      'queued' => $queued,
      'reason' => null,
    );
  }

  /**
   * @return list<wild> HTTP status code (null when no HTTP answer came
   *   back), body, transport error message.
   */
  private function get($uri, $with_token) {
    $future = id(new HTTPSFuture($uri))
      ->setMethod('GET')
      ->setTimeout(self::TIMEOUT_SECONDS);
    if ($with_token && $this->token !== null) {
      $future->addHeader('X-Service-Token', $this->token);
    }

    try {
      list($status, $body) = $future->resolve();
    } catch (Exception $ex) {
      return array(null, null, $ex->getMessage());
    }

    if (!($status instanceof HTTPFutureHTTPResponseStatus)) {
      return array(null, null, $status->getMessage());
    }

    return array((int)$status->getStatusCode(), $body, null);
  }

  private static function decodeObject($body) {
    if (!is_string($body)) {
      return array();
    }
    $decoded = json_decode($body, true);
    if (!is_array($decoded)) {
      return array();
    }
    return $decoded;
  }

}
