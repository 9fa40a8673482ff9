<?php

/**
 * The one predicate that decides whether Phorge hands Herald webhook
 * delivery to gorge-webhook.
 *
 * Both guards of the hand-over patch (no new daemon task in
 * HeraldWebhookRequest::queueCall(), a quiet exit in
 * HeraldWebhookWorker::doWork()) ask only this class, so the two can never
 * disagree.
 *
 * Silent mode keeps delivery on Phorge's own path: there the PHP worker marks
 * each row "failed" with "hook"/"silent", while gorge-webhook cannot see
 * Phorge's configuration and reads only "queued" rows.
 */
final class GorgeWebhookDelegation extends Phobject {

  const URI_KEY = 'gorge.webhook.uri';
  const TOKEN_KEY = 'gorge.webhook.token';

  /**
   * The configured base URI of gorge-webhook without a trailing slash, or
   * null when the option is unset or blank.
   *
   * @return string|null
   */
  public static function getServiceURI() {
    $uri = PhabricatorEnv::getEnvConfig(self::URI_KEY);
    if (!is_string($uri)) {
      return null;
    }

    $uri = rtrim(trim($uri), '/');
    if ($uri === '') {
      return null;
    }

    return $uri;
  }

  /**
   * @return string|null
   */
  public static function getServiceToken() {
    $token = PhabricatorEnv::getEnvConfig(self::TOKEN_KEY);
    if (!is_string($token) || $token === '') {
      return null;
    }
    return $token;
  }

  /**
   * True only when gorge.webhook.uri is set and phabricator.silent is off.
   *
   * @return bool
   */
  public static function isDeliveryDelegated() {
    if (self::getServiceURI() === null) {
      return false;
    }

    if (PhabricatorEnv::getEnvConfig('phabricator.silent')) {
      return false;
    }

    return true;
  }

  /**
   * Whether the hand-over patch is in the running code. The patch declares
   * the marker constant in both classes it changes; a Phorge upgrade that
   * overwrote either file drops it, and then Phorge delivers again although
   * gorge.webhook.uri is set.
   *
   * @return bool
   */
  public static function areGuardsInstalled() {
    foreach (self::getGuardedClasses() as $class) {
      if (!class_exists($class)) {
        return false;
      }
      $reflection = new ReflectionClass($class);
      if (!$reflection->hasConstant('GORGE_DELEGATION_GUARD')) {
        return false;
      }
    }
    return true;
  }

  /**
   * @return list<string>
   */
  public static function getGuardedClasses() {
    return array('HeraldWebhookRequest', 'HeraldWebhookWorker');
  }

}
