<?php

/**
 * Decides which Herald webhook requests Phorge hands to gorge-webhook, and
 * hands them over.
 *
 * A request is handed over by a marker in its own row: the key
 * "handedOverTo":"gorge-webhook" in the `properties` JSON. gorge-webhook
 * selects, claims and writes only rows that carry it, and Phorge never sends
 * a row that carries it, so every row belongs to exactly one side. Both guards
 * of the hand-over patch (HeraldWebhookRequest::queueCall() for new requests,
 * HeraldWebhookWorker::doWork() for tasks queued before the switch) ask only
 * handOver(), so they can never disagree. A Phorge without the patch, or with
 * the switch off, marks nothing, and gorge-webhook sends nothing.
 *
 * Silent mode keeps delivery on Phorge's own path: nothing is handed over
 * while it is on, and the PHP worker marks each new row "failed" with
 * "hook"/"silent".
 *
 * Only the rollback helper (bin/requeue-queued-requests.php) takes a row
 * back, through takeBack(), holding the hook's lock.
 */
final class GorgeWebhookDelegation extends Phobject {

  const URI_KEY = 'gorge.webhook.uri';
  const TOKEN_KEY = 'gorge.webhook.token';

  // The marker. gorge-webhook matches these exact bytes as json_encode()
  // writes them (crates/gorge-claim/src/handover.rs checks this file).
  const HANDOVER_KEY = 'handedOverTo';
  const HANDOVER_VALUE = 'gorge-webhook';

  // The version of herald-delegation.patch these classes need.
  const GUARD_VERSION = 2;

  // A row gorge-webhook claimed (dateModified ahead of its last result) less
  // than this long ago may be on its way to the receiver: never taken back.
  // Longer than any sensible claim lease (30 s by default).
  const IN_FLIGHT_WINDOW = 600;

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
   * Whether the row carries the hand-over marker: gorge-webhook delivers it,
   * and Phorge never does.
   *
   * @return bool
   */
  public static function isHandedOver(HeraldWebhookRequest $request) {
    $properties = $request->getProperties();
    return is_array($properties) &&
      idx($properties, self::HANDOVER_KEY) === self::HANDOVER_VALUE;
  }

  /**
   * The guards' one question: does gorge-webhook deliver this request?
   *
   * True for a row handed over before (whatever the switch says now) and for
   * a queued row handed over by this call: while delivery is delegated, the
   * marker is added to the row with a compare-and-set on its version that
   * leaves every other column as it is (a fresh row stays fresh for
   * gorge-webhook's claim rules). False means Phorge delivers it: delivery is
   * not delegated, or the row changed since it was read (then whoever
   * changed it, always Phorge itself, goes on with it).
   *
   * @return bool
   */
  public static function handOver(HeraldWebhookRequest $request) {
    if (self::isHandedOver($request)) {
      return true;
    }
    if (!self::isDeliveryDelegated()) {
      return false;
    }

    $properties = $request->getProperties();
    if (!is_array($properties)) {
      $properties = array();
    }
    $properties[self::HANDOVER_KEY] = self::HANDOVER_VALUE;

    $conn = $request->establishConnection('w');
    queryfx(
      $conn,
      'UPDATE %R SET properties = %s
        WHERE id = %d AND status = %s AND dateModified = %d
        AND properties NOT LIKE %~',
      $request,
      phutil_json_encode($properties),
      $request->getID(),
      HeraldWebhookRequest::STATUS_QUEUED,
      $request->getDateModified(),
      self::getMarkerText());
    if ($conn->getAffectedRows() !== 1) {
      return false;
    }

    $request->setProperties($properties);
    return true;
  }

  /**
   * Rollback: makes a handed-over queued row Phorge's again (removes the
   * marker), so that a daemon task may send it. Call only while holding the
   * hook's lock (PhabricatorGlobalLock "webhook(<hook PHID>)"), which
   * gorge-webhook holds for each whole delivery; a row gorge-webhook claimed
   * less than IN_FLIGHT_WINDOW seconds ago and has not finished is left
   * alone even then. The marker is removed with a compare-and-set on the
   * row's status, version and properties, and gorge-webhook's own claim
   * requires the marker, so of the two only one can win.
   *
   * @return string "taken" (the row is Phorge's now; the object is updated),
   *   "in-flight" (gorge-webhook may be sending it) or "changed" (no longer
   *   a queued handed-over row).
   */
  public static function takeBack(HeraldWebhookRequest $request, $now) {
    $conn = $request->establishConnection('w');
    $row = queryfx_one(
      $conn,
      'SELECT status, properties, dateCreated, dateModified, lastRequestEpoch
        FROM %R WHERE id = %d',
      $request,
      $request->getID());
    if (!$row || $row['status'] !== HeraldWebhookRequest::STATUS_QUEUED) {
      return 'changed';
    }
    $properties = json_decode($row['properties'], true);
    if (!is_array($properties) ||
        idx($properties, self::HANDOVER_KEY) !== self::HANDOVER_VALUE) {
      return 'changed';
    }

    // gorge-webhook's row states: fresh, or a result written (dateModified
    // equal to lastRequestEpoch), or else claimed and maybe being sent.
    $created = (int)$row['dateCreated'];
    $version = (int)$row['dateModified'];
    $last = (int)$row['lastRequestEpoch'];
    $fresh = ($version === $created && $last === 0);
    $settled = ($version === $last);
    if (!$fresh && !$settled && $version > $now - self::IN_FLIGHT_WINDOW) {
      return 'in-flight';
    }

    unset($properties[self::HANDOVER_KEY]);
    queryfx(
      $conn,
      'UPDATE %R SET properties = %s
        WHERE id = %d AND status = %s AND dateModified = %d
        AND properties = %s',
      $request,
      phutil_json_encode($properties),
      $request->getID(),
      HeraldWebhookRequest::STATUS_QUEUED,
      $version,
      $row['properties']);
    if ($conn->getAffectedRows() !== 1) {
      return 'changed';
    }

    $request->setProperties($properties);
    return 'taken';
  }

  /**
   * The marker as it appears inside the JSON text.
   *
   * @return string
   */
  public static function getMarkerText() {
    return substr(
      phutil_json_encode(array(self::HANDOVER_KEY => self::HANDOVER_VALUE)),
      1,
      -1);
  }

  /**
   * Whether this version of the hand-over patch is in the running code. The
   * patch declares GORGE_DELEGATION_GUARD in both classes it changes; a
   * Phorge upgrade that overwrote either file drops it (and then Phorge
   * delivers everything itself although gorge.webhook.uri is set), and an
   * older patch declares an older version.
   *
   * @return bool
   */
  public static function areGuardsInstalled() {
    foreach (self::getGuardedClasses() as $class) {
      if (!class_exists($class)) {
        return false;
      }
      $reflection = new ReflectionClass($class);
      if ($reflection->getConstant('GORGE_DELEGATION_GUARD') !==
          self::GUARD_VERSION) {
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
