<?php

/**
 * Setup check for the gorge-webhook hand-over. Runs only when
 * gorge.webhook.uri is set; then it tells the operator when
 * gorge-webhook is not ready (requests wait), and when both Phorge and
 * gorge-webhook would deliver (the patch is missing, or silent mode is on
 * while the service runs). It only reports; nothing waits on it.
 */
final class GorgeWebhookSetupCheck extends PhabricatorSetupCheck {

  public function getDefaultGroup() {
    return self::GROUP_IMPORTANT;
  }

  protected function executeChecks() {
    $uri = GorgeWebhookDelegation::getServiceURI();
    if ($uri === null) {
      return;
    }

    $probe = new GorgeWebhookServiceProbe(
      $uri,
      GorgeWebhookDelegation::getServiceToken());
    $readiness = $probe->probeReadiness();

    if (!GorgeWebhookDelegation::areGuardsInstalled()) {
      $this->raiseGuardsMissing($uri, $readiness);
      return;
    }

    if (!GorgeWebhookDelegation::isDeliveryDelegated()) {
      // With the URI set, only silent mode turns delegation off.
      if ($readiness['reachable']) {
        $this->raiseSilentWhileRunning($uri);
      }
      return;
    }

    if (!$readiness['ready']) {
      $this->raiseNotReady($uri, $readiness['reason']);
      return;
    }

    if (GorgeWebhookDelegation::getServiceToken() !== null) {
      $counts = $probe->fetchQueueCounts();
      if ($counts['reason'] !== null) {
        $this->newIssue('gorge.webhook.stats')
          ->setName(pht('gorge-webhook Diagnostics Unavailable'))
          ->setSummary(pht('Could not read gorge-webhook\'s queue counts.'))
          ->setMessage(
            pht(
              'gorge-webhook is ready and delivers webhooks, but its '.
              'diagnostic endpoint did not answer as expected: %s',
              $counts['reason']))
          ->addPhabricatorConfig(GorgeWebhookDelegation::TOKEN_KEY);
      }
    }
  }

  private function raiseGuardsMissing($uri, array $readiness) {
    if ($readiness['reachable']) {
      $state = pht(
        'gorge-webhook answers at %s, so right now BOTH deliver: every '.
        'receiver gets every webhook request twice.',
        $uri);
    } else {
      $state = pht(
        'gorge-webhook does not answer at %s (%s); as soon as it runs, '.
        'every receiver gets every webhook request twice.',
        $uri,
        $readiness['reason']);
    }

    $this->newIssue('gorge.webhook.guards-missing')
      ->setName(pht('Webhooks Delivered Twice: gorge Patch Missing'))
      ->setSummary(
        pht(
          '"%s" is set, but this Phorge still delivers webhooks itself.',
          GorgeWebhookDelegation::URI_KEY))
      ->setMessage(
        pht(
          '"%s" is set, but the gorge hand-over patch is not in %s '.
          '(a Phorge upgrade may have replaced the patched files), so '.
          'Phorge still queues and runs its own webhook workers. %s '.
          "\n\n".
          'Re-apply the patch with "compat/phorge/apply.sh <phorge root>" '.
          'from the gorge repository and restart the daemons, or clear '.
          '"%s" and stop gorge-webhook.',
          GorgeWebhookDelegation::URI_KEY,
          implode(', ', GorgeWebhookDelegation::getGuardedClasses()),
          $state,
          GorgeWebhookDelegation::URI_KEY))
      ->addPhabricatorConfig(GorgeWebhookDelegation::URI_KEY);
  }

  private function raiseSilentWhileRunning($uri) {
    $this->newIssue('gorge.webhook.silent')
      ->setName(pht('gorge-webhook Runs While Phorge Is Silent'))
      ->setSummary(
        pht(
          'Silent mode is on, but gorge-webhook is running and may send '.
          'webhooks.'))
      ->setMessage(
        pht(
          '"%s" is on, so Phorge keeps webhook delivery on its own path and '.
          'marks each request as failed in silent mode. But gorge-webhook '.
          'answers at %s: it cannot see silent mode and sends every request '.
          'it finds still queued, before Phorge\'s daemons get to it. Both '.
          'sides deliver. Stop gorge-webhook while silent mode is on, or '.
          'turn silent mode off to hand delivery over to it.',
          'phabricator.silent',
          $uri))
      ->addPhabricatorConfig('phabricator.silent')
      ->addPhabricatorConfig(GorgeWebhookDelegation::URI_KEY);
  }

  private function raiseNotReady($uri, $reason) {
    $this->newIssue('gorge.webhook.not-ready')
      ->setName(pht('gorge-webhook Is Not Ready'))
      ->setSummary(
        pht(
          'Webhook delivery is handed to gorge-webhook, which is not ready; '.
          'webhook requests wait.'))
      ->setMessage(
        pht(
          'Webhook delivery is handed over to gorge-webhook at %s ("%s"), '.
          'but the service is not ready: %s'.
          "\n\n".
          'Nothing is lost: requests stay queued and are delivered, oldest '.
          'first, once the service is ready. Until then no webhook is '.
          'sent. Check that gorge-webhook is running and can reach this '.
          'Phorge\'s database (its /readyz reason names the problem).',
          $uri,
          GorgeWebhookDelegation::URI_KEY,
          $reason))
      ->addPhabricatorConfig(GorgeWebhookDelegation::URI_KEY);
  }

}
